//! Keeping the verified programs pinned across restarts, and deciding whether a restarted
//! manager may reuse them instead of loading (and having the kernel verify) the object again.
//!
//! Layout: `<pin_dir>/progs/<object digest>/weft_from_pod` and `.../weft_to_pod`. The digest
//! covers the object's bytes and every `max_entries` the loader sets, so it names exactly what a
//! fresh load would produce; bpffs holds no regular files, which is why it is a directory name.
//! Pins are reused only when both programs are pinned under this object's digest AND every map
//! they reference is one of the maps this manager just opened from the pin dir (a map that was
//! recreated, e.g. after its pin was removed, has another id: the pinned program would enforce
//! from the old one). Why this is safe and the crash-safe ordering: docs/DATAPATH.md,
//! "Program pins".

use super::error::DatapathError;
use super::state::Programs;
use super::types::DatapathConfig;
use aya::maps::{Map, MapData};
use aya::programs::SchedClassifier;
use aya::{Ebpf, EbpfLoader};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use weft_ebpf::{self as abi, map_names as names};

/// Directory under the pin dir holding one sub-directory per pinned object digest.
pub(crate) const PROGS_DIR: &str = "progs";

/// FNV-1a, 128 bits, over the object and the map sizes: a different object or a different
/// size produces other pins. Not a security boundary (writing bpffs takes root), only identity.
#[must_use]
pub(crate) fn object_digest(object: &[u8], config: &DatapathConfig) -> String {
    let mut h = weft_api::fnv::Fnv128::new();
    h.feed(&(object.len() as u64).to_le_bytes());
    h.feed(object);
    for (_, max) in config.map_sizes() {
        h.feed(&max.to_le_bytes());
    }
    format!("{:032x}", h.finish())
}

/// The pinned programs as the decision sees them (the seam: bpffs + `BPF_OBJ_GET` +
/// `bpf_prog_get_info` in [`BpfPins`], a map in memory in tests).
pub(crate) trait PinnedPrograms {
    /// Digest directories present under `progs/` (empty when there is none, e.g. an upgrade
    /// from a version that did not pin programs).
    fn digests(&self) -> Result<Vec<String>, String>;
    /// The ids of the maps the program pinned as `program` under `digest` uses; `None` when
    /// that pin does not exist.
    fn map_ids(&self, digest: &str, program: &str) -> Result<Option<Vec<u32>>, String>;
}

/// What a starting manager does with its programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Both programs are pinned for this object and use exactly the opened maps.
    Reuse,
    /// Load the object's programs afresh (the kernel verifies them), then re-attach every
    /// endpoint, then pin. Why, for the log.
    Load(String),
}

/// Decides reuse against reload; see the module comment.
pub(crate) fn decide(
    pins: &dyn PinnedPrograms,
    digest: &str,
    programs: &[&str],
    opened_maps: &BTreeSet<u32>,
) -> Decision {
    let digests = match pins.digests() {
        Ok(d) => d,
        Err(e) => return Decision::Load(format!("reading the program pins: {e}")),
    };
    if digests.is_empty() {
        return Decision::Load("no pinned programs (first start, or pins removed)".into());
    }
    if !digests.iter().any(|d| d == digest) {
        return Decision::Load(format!(
            "the object changed (pinned {}, this build {digest})",
            digests.join(",")
        ));
    }
    for program in programs {
        let ids = match pins.map_ids(digest, program) {
            Ok(Some(ids)) => ids,
            Ok(None) => return Decision::Load(format!("program pin {program} is missing")),
            Err(e) => return Decision::Load(format!("program pin {program}: {e}")),
        };
        let used: BTreeSet<u32> = ids.into_iter().collect();
        if used.is_empty() || !used.is_subset(opened_maps) {
            return Decision::Load(format!(
                "pinned {program} uses maps {used:?}, not the opened ones {opened_maps:?}"
            ));
        }
    }
    Decision::Reuse
}

/// Where program `program` of object `digest` is pinned.
pub(crate) fn pin_path(pin_dir: &Path, digest: &str, program: &str) -> PathBuf {
    pin_dir.join(PROGS_DIR).join(digest).join(program)
}

/// Removes every program pin (all digests). Called after a fresh load and before the first
/// re-attach, so that a crash while endpoints are half re-attached leaves no pins to trust.
pub(crate) fn remove_all(pin_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(pin_dir.join(PROGS_DIR)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The kernel side of [`PinnedPrograms`].
pub(crate) struct BpfPins<'a> {
    pub(crate) pin_dir: &'a Path,
}

impl PinnedPrograms for BpfPins<'_> {
    fn digests(&self) -> Result<Vec<String>, String> {
        let dir = self.pin_dir.join(PROGS_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(out)
    }

    fn map_ids(&self, digest: &str, program: &str) -> Result<Option<Vec<u32>>, String> {
        let path = pin_path(self.pin_dir, digest, program);
        if !path.exists() {
            return Ok(None);
        }
        let info = aya::programs::ProgramInfo::from_pin(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if info.name_as_str() != Some(program) {
            return Err(format!(
                "{} holds program {:?}, not {program}",
                path.display(),
                info.name_as_str()
            ));
        }
        info.map_ids()
            .map(|ids| Some(ids.unwrap_or_default()))
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Maps and programs of a start: by name, as `aya::maps::Map`, with the programs.
pub(crate) struct Opened {
    /// The loaded object (fresh load only; it owns the programs then).
    pub(crate) ebpf: Option<Ebpf>,
    /// Every map of `names::ALL`.
    pub(crate) maps: HashMap<&'static str, Map>,
    pub(crate) programs: Programs,
    /// Why the programs were loaded afresh (`None`: reused), for the log.
    pub(crate) reason: Option<String>,
}

/// The reuse path: every map and both programs straight from their pins, without parsing the
/// object (aya's loader parses the kernel's whole BTF and the ELF, which costs more than
/// everything else a restart does). `Err` says why the object must be loaded instead: a map or
/// program pin is missing, or [`decide`] refuses.
fn open_pinned(config: &DatapathConfig, digest: &str) -> Result<Opened, String> {
    let mut data = HashMap::new();
    let mut ids = BTreeSet::new();
    for name in names::ALL {
        let path = config.pin_dir.join(name);
        if !path.exists() {
            return Err(format!("map {name} is not pinned yet"));
        }
        let map = MapData::from_pin(&path).map_err(|e| format!("map {name}: {e}"))?;
        ids.insert(map.info().map_err(|e| format!("map {name}: {e}"))?.id());
        data.insert(name, map);
    }
    let programs = [abi::PROG_FROM_POD, abi::PROG_TO_POD];
    if let Decision::Load(reason) = decide(
        &BpfPins {
            pin_dir: &config.pin_dir,
        },
        digest,
        &programs,
        &ids,
    ) {
        return Err(reason);
    }
    let open = |name| {
        SchedClassifier::from_pin(pin_path(&config.pin_dir, digest, name))
            .map_err(|e| format!("opening the pinned {name}: {e}"))
    };
    let pinned = [open(abi::PROG_FROM_POD)?, open(abi::PROG_TO_POD)?];
    let mut maps = HashMap::new();
    for (name, map) in data {
        maps.insert(
            name,
            Map::from_map_data(map).map_err(|e| format!("map {name}: {e}"))?,
        );
    }
    Ok(Opened {
        ebpf: None,
        maps,
        programs: Programs {
            pinned: Some(pinned),
            digest: digest.to_owned(),
            committed: true,
            ids: None,
        },
        reason: None,
    })
}

/// Opens the maps and programs: the pinned ones when they can be reused (see the module
/// comment), else the object is loaded — maps opened from their pins or created, programs
/// loaded (the kernel verifies them) — and every program pin is removed before anything is
/// attached with the new programs.
pub(crate) fn open(config: &DatapathConfig, digest: &str) -> Result<Opened, DatapathError> {
    let reason = match open_pinned(config, digest) {
        Ok(opened) => return Ok(opened),
        Err(reason) => reason,
    };
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(&config.pin_dir);
    for (name, max) in config.map_sizes() {
        loader.map_max_entries(name, max);
    }
    let mut ebpf = loader
        .load(abi::object())
        .map_err(|e| DatapathError::Load(Box::new(e)))?;
    for program in [abi::PROG_FROM_POD, abi::PROG_TO_POD] {
        let prog = ebpf
            .program_mut(program)
            .ok_or(DatapathError::Missing(program))?;
        <&mut SchedClassifier>::try_from(prog)
            .and_then(SchedClassifier::load)
            .map_err(|e| DatapathError::Program {
                program,
                ifname: "(load)".to_owned(),
                source: Box::new(e),
            })?;
    }
    // From here on filters get the new programs; pins of earlier programs must not survive a
    // crash before every endpoint has been moved over (the next start would trust them).
    remove_all(&config.pin_dir).map_err(|source| DatapathError::Bpffs {
        path: config.pin_dir.join(PROGS_DIR),
        source,
    })?;
    let mut maps = HashMap::new();
    for name in names::ALL {
        maps.insert(
            name,
            ebpf.take_map(name).ok_or(DatapathError::Missing(name))?,
        );
    }
    Ok(Opened {
        ebpf: Some(ebpf),
        maps,
        programs: Programs {
            pinned: None,
            digest: digest.to_owned(),
            committed: false,
            ids: None,
        },
        reason: Some(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Pins in memory: (digest, program) → map ids.
    #[derive(Default)]
    struct FakePins {
        pins: BTreeMap<(String, String), Vec<u32>>,
        dirs: BTreeSet<String>,
        broken: bool,
    }

    impl FakePins {
        fn pin(mut self, digest: &str, program: &str, ids: &[u32]) -> Self {
            self.dirs.insert(digest.into());
            self.pins
                .insert((digest.into(), program.into()), ids.to_vec());
            self
        }
    }

    impl PinnedPrograms for FakePins {
        fn digests(&self) -> Result<Vec<String>, String> {
            if self.broken {
                return Err("EACCES".into());
            }
            Ok(self.dirs.iter().cloned().collect())
        }
        fn map_ids(&self, digest: &str, program: &str) -> Result<Option<Vec<u32>>, String> {
            Ok(self.pins.get(&(digest.into(), program.into())).cloned())
        }
    }

    const PROGS: [&str; 2] = ["weft_from_pod", "weft_to_pod"];
    fn opened() -> BTreeSet<u32> {
        (10..18).collect()
    }
    fn decide_on(pins: &FakePins) -> Decision {
        decide(pins, "d1", &PROGS, &opened())
    }
    fn reason(d: Decision) -> String {
        match d {
            Decision::Load(why) => why,
            Decision::Reuse => panic!("expected a reload"),
        }
    }

    #[test]
    fn same_object_and_same_maps_are_reused() {
        let pins =
            FakePins::default()
                .pin("d1", PROGS[0], &[10, 11, 12])
                .pin("d1", PROGS[1], &[10, 13]);
        assert_eq!(decide_on(&pins), Decision::Reuse);
    }

    #[test]
    fn no_pins_at_all_loads_fresh() {
        // First start, or an upgrade from a version that only pinned maps.
        assert!(reason(decide_on(&FakePins::default())).contains("no pinned programs"));
    }

    #[test]
    fn another_digest_loads_fresh() {
        let pins = FakePins::default()
            .pin("d0", PROGS[0], &[10])
            .pin("d0", PROGS[1], &[10]);
        assert!(reason(decide_on(&pins)).contains("object changed"));
    }

    #[test]
    fn a_partial_pin_set_loads_fresh() {
        let pins = FakePins::default().pin("d1", PROGS[0], &[10]);
        assert!(reason(decide_on(&pins)).contains("weft_to_pod is missing"));
        let mut only_dir = FakePins::default();
        only_dir.dirs.insert("d1".into());
        assert!(reason(decide_on(&only_dir)).contains("weft_from_pod is missing"));
    }

    #[test]
    fn a_program_using_other_maps_loads_fresh() {
        // A map recreated (its pin removed) while the programs stayed pinned.
        let pins = FakePins::default()
            .pin("d1", PROGS[0], &[10, 99])
            .pin("d1", PROGS[1], &[10]);
        assert!(reason(decide_on(&pins)).contains("not the opened ones"));
        let none = FakePins::default()
            .pin("d1", PROGS[0], &[])
            .pin("d1", PROGS[1], &[10]);
        assert!(reason(decide_on(&none)).contains("not the opened ones"));
    }

    #[test]
    fn an_unreadable_pin_dir_loads_fresh() {
        let pins = FakePins {
            broken: true,
            ..FakePins::default()
        };
        assert!(reason(decide_on(&pins)).contains("EACCES"));
    }

    #[test]
    fn the_digest_covers_object_and_map_sizes() {
        let c = DatapathConfig::default();
        let a = object_digest(b"object", &c);
        assert_eq!(a, object_digest(b"object", &c));
        assert_ne!(a, object_digest(b"objecT", &c));
        let bigger = DatapathConfig {
            ct_max: c.ct_max * 2,
            ..DatapathConfig::default()
        };
        assert_ne!(a, object_digest(b"object", &bigger));
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn the_digest_keeps_its_value_across_versions() {
        // The pins of a running node live under this name: another value makes an upgraded
        // manager load and verify its programs afresh instead of reusing them. (Changed when the
        // Service maps joined the map sizes the digest covers, and when the policy trie became
        // the pairs and port lists.)
        assert_eq!(
            object_digest(b"weft", &DatapathConfig::default()),
            "81ad15c5766cce242d7d636bc39aa6b3"
        );
    }
}
