//! Attaching the programs to a host veth with netlink `cls_bpf` (not TCX).
//!
//! Why netlink: PLATFORM.md measured 10–50 µs per attach against 6–12 ms for TCX, and the CNI ADD
//! has to beat ptp+host-local. A `cls_bpf` filter holds its own reference to the program, so once
//! aya's link object is forgotten the filter survives the manager. Every Weft filter sits at a
//! fixed (priority, handle), which is what lets a restarted manager find it again and replace the
//! program in place (a netlink change without `NLM_F_CREATE` on the same prio/handle swaps the
//! program atomically: no window without a filter).

use super::error::DatapathError;
use aya::programs::tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle};
use aya::programs::{Link as _, ProgramError, SchedClassifier, TcAttachType, TcError};

/// tc priority of Weft's filters (`tc filter show dev X ingress` shows `pref 1`).
pub(crate) const PRIORITY: u16 = 1;
/// tc handle of Weft's filters.
pub(crate) const HANDLE: TcHandle = TcHandle::new(0, 1);

fn os_error(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::TcError(TcError::NetlinkError(n)) => n.raw_os_error(),
        ProgramError::TcError(TcError::IoError(io)) => io.raw_os_error(),
        _ => None,
    }
}

fn program_error(program: &'static str, ifname: &str, e: ProgramError) -> DatapathError {
    DatapathError::Program {
        program,
        ifname: ifname.to_owned(),
        source: Box::new(e),
    }
}

/// Adds the clsact qdisc unless the interface already has it.
pub(crate) fn ensure_clsact(ifname: &str) -> Result<(), DatapathError> {
    match aya::programs::tc::qdisc_add_clsact(ifname) {
        Ok(()) | Err(TcError::AlreadyAttached) => Ok(()),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(program_error("clsact", ifname, ProgramError::TcError(e))),
    }
}

/// Attaches `program` to `ifname` at Weft's (priority, handle), replacing whatever program a
/// previous manager left there, and leaves the filter in place when this process exits.
pub(crate) fn attach(
    prog: &mut SchedClassifier,
    program: &'static str,
    ifname: &str,
    attach_type: TcAttachType,
) -> Result<(), DatapathError> {
    let options = TcAttachOptions::Netlink(NlOptions {
        priority: PRIORITY,
        handle: HANDLE,
        classid: None,
    });
    let id = match prog.attach_with_options(ifname, attach_type, options) {
        Ok(id) => id,
        // Created with NLM_F_EXCL: EEXIST means our filter is there already (restart or a
        // repeated attach); replace its program in place.
        Err(e) if os_error(&e) == Some(libc::EEXIST) => {
            let link = SchedClassifierLink::attached(ifname, attach_type, PRIORITY, HANDLE, None)
                .map_err(|io| program_error(program, ifname, TcError::IoError(io).into()))?;
            prog.attach_to_link(link)
                .map_err(|e| program_error(program, ifname, e))?
        }
        Err(e) => return Err(program_error(program, ifname, e)),
    };
    let link = prog
        .take_link(id)
        .map_err(|e| program_error(program, ifname, e))?;
    // Dropping the link would detach the filter; the datapath must outlive the manager.
    std::mem::forget(link);
    Ok(())
}

/// Removes Weft's filter from `ifname`. A missing interface or filter counts as detached.
pub(crate) fn detach(
    program: &'static str,
    ifname: &str,
    attach_type: TcAttachType,
) -> Result<(), DatapathError> {
    let link = match SchedClassifierLink::attached(ifname, attach_type, PRIORITY, HANDLE, None) {
        Ok(link) => link,
        Err(e)
            if e.raw_os_error() == Some(libc::ENODEV)
                || e.kind() == std::io::ErrorKind::NotFound
                || !link_exists(ifname) =>
        {
            return Ok(());
        }
        Err(e) => return Err(program_error(program, ifname, TcError::IoError(e).into())),
    };
    match link.detach() {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                os_error(&e),
                Some(libc::ENOENT | libc::ENODEV | libc::EINVAL)
            ) =>
        {
            Ok(())
        }
        // The CNI deletes the host veth while the manager detaches (DEL runs both at once): a
        // veth torn down mid-request answers with assorted netlink errors, some without an
        // errno. A filter on a link that no longer exists is detached, whatever the error said.
        Err(_) if !link_exists(ifname) => Ok(()),
        Err(e) => Err(program_error(program, ifname, e)),
    }
}

fn link_exists(ifname: &str) -> bool {
    nix::net::if_::if_nametoindex(ifname).is_ok()
}
