//! Checks of what API callers send, before anything is reserved or changed. Every string the
//! manager stores is later printed by weftctl and logged: control characters and unbounded
//! sizes are refused here, with the field named.

use weft_api::naming::{container_id_problem, ifname_problem};
use weft_api::{AllocateRequest, RegisterRequest};

use super::ManagerError;

/// Longest netns path accepted (Linux `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Kubernetes namespace and pod names are DNS subdomains: at most 253 bytes.
const MAX_POD_NAME: usize = 253;
/// Most labels one endpoint may carry.
pub const MAX_LABELS: usize = 256;

fn invalid(msg: String) -> ManagerError {
    ManagerError::Invalid(msg)
}

/// `container_id` and `ifname` as the CNI passes them (also the DELETE/GET query).
pub fn owner(container_id: &str, ifname: &str) -> Result<(), ManagerError> {
    if let Some(why) = container_id_problem(container_id) {
        return Err(invalid(format!("container_id: {why}")));
    }
    if let Some(why) = ifname_problem(ifname) {
        return Err(invalid(format!("ifname: {why}")));
    }
    Ok(())
}

/// A netns handle path: absolute, no `..`, no control characters; if it exists where the
/// manager can see it, it must be a network namespace handle (nsfs), not `/etc` or a file.
pub fn netns(path: &str) -> Result<(), ManagerError> {
    let shown: String = path.chars().take(80).collect();
    if path.len() > MAX_PATH || !path.starts_with('/') || path.chars().any(char::is_control) {
        return Err(invalid(format!(
            "netns {shown:?} is not an absolute path of at most {MAX_PATH} bytes without control characters"
        )));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(invalid(format!(
            "netns {shown:?} holds a '..' component; pass the namespace handle's real path"
        )));
    }
    // The manager may run in another mount namespace than the runtime: a path it cannot see is
    // not proof of a bad request, but one it sees must be a netns handle.
    if let Ok(fs) = nix::sys::statfs::statfs(path) {
        // statfs follows /proc/PID/ns/net to nsfs like any bind-mounted handle.
        if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
            return Err(invalid(format!(
                "netns {shown:?} is not a network namespace handle (expected a file on nsfs, such as /var/run/netns/NAME or /proc/PID/ns/net)"
            )));
        }
    }
    Ok(())
}

fn pod_name(field: &str, v: Option<&str>) -> Result<(), ManagerError> {
    let Some(v) = v else { return Ok(()) };
    let ok = !v.is_empty()
        && v.len() <= MAX_POD_NAME
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "{field} {:?} is not a Kubernetes name (1-{MAX_POD_NAME} bytes of [a-zA-Z0-9.-_])",
            v.chars().take(80).collect::<String>()
        )))
    }
}

/// Everything in an allocate request.
pub fn allocate(req: &AllocateRequest) -> Result<(), ManagerError> {
    owner(&req.container_id, &req.ifname)?;
    netns(&req.netns)?;
    pod_name("pod_namespace", req.pod_namespace.as_deref())?;
    pod_name("pod_name", req.pod_name.as_deref())?;
    if req.labels.len() > MAX_LABELS {
        return Err(invalid(format!(
            "{} labels given; at most {MAX_LABELS} are accepted",
            req.labels.len()
        )));
    }
    for l in &req.labels {
        weft_policy::labels::check_key(&l.key)
            .and_then(|()| weft_policy::labels::check_value(&l.value))
            .map_err(|e| invalid(format!("labels: {e}")))?;
    }
    Ok(())
}

/// A register request's own fields (ownership and state are the registry's to check).
pub fn register(req: &RegisterRequest) -> Result<(), ManagerError> {
    if let Some(why) = container_id_problem(&req.container_id) {
        return Err(invalid(format!("container_id: {why}")));
    }
    if req.host_ifindex == 0 {
        return Err(invalid("host_ifindex 0 is not an interface".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Mutate = Box<dyn Fn(&mut AllocateRequest)>;

    fn req() -> AllocateRequest {
        AllocateRequest {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/x".into(),
            pod_namespace: Some("ns1".into()),
            pod_name: Some("p-1".into()),
            labels: vec![weft_api::Label {
                key: "app".into(),
                value: "web".into(),
            }],
        }
    }

    #[test]
    fn good_requests_pass_and_each_bad_field_is_named() {
        allocate(&req()).unwrap();
        let cases: Vec<(Mutate, &str)> = vec![
            (Box::new(|r| r.ifname = "../../x".into()), "ifname"),
            (
                Box::new(|r| r.netns = "/etc".into()),
                "not a network namespace",
            ),
            (Box::new(|r| r.netns = "relative".into()), "absolute"),
            (
                Box::new(|r| r.netns = "/var/run/netns/../../etc".into()),
                "'..'",
            ),
            (
                Box::new(|r| r.container_id = "a".repeat(100_000)),
                "container_id",
            ),
            (Box::new(|r| r.pod_name = Some("a\nb".into())), "pod_name"),
            (Box::new(|r| r.labels[0].key = "\0".into()), "labels"),
            (
                Box::new(|r| r.labels[0].value = "a\nINJECTED".into()),
                "labels",
            ),
        ];
        for (mutate, want) in cases {
            let mut r = req();
            mutate(&mut r);
            let err = allocate(&r).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should name {want}");
            assert!(
                err.len() < 400,
                "error echoes unbounded input: {}",
                err.len()
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_allocate_request_is_accepted_clean_or_refused_by_name(
            id in ".{0,140}", ifname in ".{0,20}", netns in ".{0,40}",
            name in proptest::option::of(".{0,20}"), key in ".{0,20}", value in ".{0,20}",
        ) {
            let r = AllocateRequest {
                container_id: id, ifname, netns, pod_namespace: None, pod_name: name,
                labels: vec![weft_api::Label { key, value }],
            };
            match allocate(&r) {
                Ok(()) => {
                    let all = format!("{}{}{}{:?}{}{}", r.container_id, r.ifname, r.netns,
                        r.pod_name, r.labels[0].key, r.labels[0].value);
                    proptest::prop_assert!(!all.chars().any(char::is_control));
                    proptest::prop_assert!(r.container_id.len() <= 128 && r.ifname.len() <= 15);
                }
                Err(e) => proptest::prop_assert!(matches!(e, ManagerError::Invalid(_))),
            }
        }

        #[test]
        fn any_request_body_decodes_or_is_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = serde_json::from_slice::<AllocateRequest>(&bytes);
            let _ = serde_json::from_slice::<RegisterRequest>(&bytes);
            let _ = serde_json::from_slice::<weft_api::GcRequest>(&bytes);
            let _ = serde_json::from_slice::<weft_api::TraceRequest>(&bytes);
        }
    }
}
