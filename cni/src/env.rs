//! The `CNI_*` environment, parsed and validated before anything is touched.

use crate::error::CniError;
use std::path::PathBuf;

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// ADD.
    Add,
    /// DEL.
    Del,
    /// CHECK.
    Check,
    /// STATUS (1.1.0).
    Status,
    /// GC (1.1.0).
    Gc,
    /// VERSION.
    Version,
}

impl Command {
    fn parse(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            "VERSION" => Self::Version,
            other => {
                return Err(CniError::InvalidEnv(format!(
                    "unknown CNI_COMMAND {other:?}"
                )));
            }
        })
    }
}

/// The known `CNI_ARGS` keys (CNI CONVENTIONS and what Kubernetes runtimes pass).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
}

/// Parses `K=V;K=V` (any order). Unknown keys are an error unless `IgnoreUnknown` is true, as in
/// libcni's `types.LoadArgs`.
pub fn parse_cni_args(raw: &str) -> Result<CniArgs, CniError> {
    let mut args = CniArgs::default();
    let mut unknown = Vec::new();
    let mut ignore_unknown = false;
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| CniError::InvalidEnv(format!("CNI_ARGS: {pair:?} is not K=V")))?;
        match k {
            "IgnoreUnknown" => {
                ignore_unknown = match v {
                    "1" | "true" | "True" | "TRUE" => true,
                    "0" | "false" | "False" | "FALSE" => false,
                    _ => {
                        return Err(CniError::InvalidEnv(format!(
                            "CNI_ARGS: IgnoreUnknown={v:?} is not a boolean"
                        )));
                    }
                };
            }
            "K8S_POD_NAMESPACE" => args.pod_namespace = Some(v.to_owned()),
            "K8S_POD_NAME" => args.pod_name = Some(v.to_owned()),
            "K8S_POD_INFRA_CONTAINER_ID" | "K8S_POD_UID" => {}
            other => unknown.push(other.to_owned()),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::InvalidEnv(format!(
            "CNI_ARGS: unknown keys {unknown:?} (set IgnoreUnknown=1 to allow)"
        )));
    }
    Ok(args)
}

/// CNI SPEC: a container id starts with an alphanumeric and continues with `[a-zA-Z0-9_.-]`;
/// Weft bounds it to `weft_api::naming::MAX_CONTAINER_ID_LEN` bytes.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    match weft_api::naming::container_id_problem(id) {
        None => Ok(()),
        Some(why) => Err(CniError::InvalidEnv(format!("CNI_CONTAINERID: {why}"))),
    }
}

/// Linux `dev_valid_name`: 1–15 bytes, no `/`, `:` or whitespace, not `.` or `..`.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    match weft_api::naming::ifname_problem(name) {
        None => Ok(()),
        Some(why) => Err(CniError::InvalidEnv(format!("CNI_IFNAME: {why}"))),
    }
}

/// The validated environment. Fields a command does not need may be empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (ADD, DEL, CHECK).
    pub container_id: String,
    /// `CNI_NETNS` (required for ADD, CHECK; may be empty for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (ADD, DEL, CHECK).
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: CniArgs,
    /// `CNI_PATH` (unused: Weft delegates to no other plugin).
    pub path: Option<String>,
}

/// Every variable the plugin reads.
const VARS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// Longest value accepted for any `CNI_*` variable: far above real use (a path, an id, a few
/// `K=V` pairs), far below what could exhaust memory or logs.
pub const MAX_VAR_LEN: usize = 64 * 1024;

impl CniEnv {
    /// Reads the process environment: a variable that is not UTF-8 or is over [`MAX_VAR_LEN`]
    /// is refused by name (code 4), rather than treated as unset.
    pub fn from_os_lookup(
        get: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self, CniError> {
        let mut vals = std::collections::HashMap::new();
        for k in VARS {
            let Some(v) = get(k) else { continue };
            let v = v.into_string().map_err(|_| {
                CniError::InvalidEnv(format!("{k} is not valid UTF-8; pass it as UTF-8 text"))
            })?;
            if v.len() > MAX_VAR_LEN {
                return Err(CniError::InvalidEnv(format!(
                    "{k} is {} bytes long; at most {MAX_VAR_LEN} are accepted",
                    v.len()
                )));
            }
            vals.insert(k, v);
        }
        Self::from_lookup(|k| vals.get(k).cloned())
    }

    /// Reads the variables through `get` (the process environment in `main`, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let command = Command::parse(
            &get("CNI_COMMAND")
                .ok_or_else(|| CniError::InvalidEnv("CNI_COMMAND is not set".into()))?,
        )?;
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
        let required = |k: &str| {
            nonempty(k)
                .ok_or_else(|| CniError::InvalidEnv(format!("{k} is required for this command")))
        };
        let mut env = Self {
            command,
            container_id: String::new(),
            netns: nonempty("CNI_NETNS").map(PathBuf::from),
            ifname: String::new(),
            args: parse_cni_args(&get("CNI_ARGS").unwrap_or_default())?,
            path: nonempty("CNI_PATH"),
        };
        if per_container {
            env.container_id = required("CNI_CONTAINERID")?;
            validate_container_id(&env.container_id)?;
            env.ifname = required("CNI_IFNAME")?;
            validate_ifname(&env.ifname)?;
        }
        if matches!(command, Command::Add | Command::Check) {
            let netns = PathBuf::from(required("CNI_NETNS")?);
            if !netns.exists() {
                return Err(CniError::InvalidEnv(format!(
                    "CNI_NETNS {} does not exist",
                    netns.display()
                )));
            }
            env.netns = Some(netns);
        }
        Ok(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        CniEnv::from_lookup(|k| m.get(k).cloned())
    }

    const ADD: [(&str, &str); 4] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc-1_2.3"),
        ("CNI_NETNS", "/proc/self/ns/net"),
        ("CNI_IFNAME", "eth0"),
    ];

    fn with(over: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = ADD
            .iter()
            .filter(|(k, _)| !over.iter().any(|(o, _)| o == k))
            .copied()
            .collect();
        v.extend(over.iter().copied().filter(|(_, val)| *val != "<unset>"));
        v
    }

    #[test]
    fn valid_add() {
        let e = env(&ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id, "abc-1_2.3");
        assert_eq!(e.ifname, "eth0");
        assert_eq!(
            e.netns.as_deref(),
            Some(std::path::Path::new("/proc/self/ns/net"))
        );
    }

    #[test]
    fn bad_env_is_code_4() {
        let cases: &[&[(&str, &str)]] = &[
            &[("CNI_COMMAND", "<unset>")],
            &[("CNI_COMMAND", "FROB")],
            &[("CNI_CONTAINERID", "")],
            &[("CNI_CONTAINERID", "-abc")],
            &[("CNI_CONTAINERID", "a/b")],
            &[("CNI_CONTAINERID", "a b")],
            &[("CNI_IFNAME", "<unset>")],
            &[("CNI_IFNAME", "a234567890123456")],
            &[("CNI_IFNAME", "eth/0")],
            &[("CNI_IFNAME", "eth:0")],
            &[("CNI_IFNAME", "eth 0")],
            &[("CNI_IFNAME", ".")],
            &[("CNI_IFNAME", "..")],
            &[("CNI_NETNS", "")],
            &[("CNI_NETNS", "/nonexistent/netns")],
            &[("CNI_ARGS", "K8S_POD_NAME")],
            &[("CNI_ARGS", "FOO=bar")],
            &[("CNI_ARGS", "IgnoreUnknown=maybe")],
        ];
        for over in cases {
            let err = env(&with(over)).unwrap_err();
            assert_eq!(err.code(), 4, "{over:?}: {err}");
        }
    }

    #[test]
    fn a_huge_container_id_and_non_utf8_are_code_4_naming_the_variable() {
        let long = "a".repeat(100_000);
        let err = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", long.as_str()),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(err.to_string().contains("at most 128"), "{err}");
        assert!(err.to_string().len() < 300, "the id is not echoed");
        let err = CniEnv::from_os_lookup(|k| match k {
            "CNI_COMMAND" => Some("DEL".into()),
            "CNI_CONTAINERID" => Some(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(vec![b'a', 0xff]),
            ),
            "CNI_IFNAME" => Some("eth0".into()),
            _ => None,
        })
        .unwrap_err();
        assert_eq!(err.code(), 4);
        assert!(
            err.to_string()
                .contains("CNI_CONTAINERID is not valid UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn fifteen_byte_ifname_is_fine() {
        assert!(env(&with(&[("CNI_IFNAME", "a23456789012345")])).is_ok());
    }

    #[test]
    fn del_accepts_empty_netns() {
        let e = env(&with(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")])).unwrap();
        assert_eq!(e.netns, None);
    }

    #[test]
    fn status_needs_no_container() {
        let e = env(&[("CNI_COMMAND", "STATUS")]).unwrap();
        assert_eq!(e.command, Command::Status);
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC")]).is_ok());
    }

    #[test]
    fn cni_args_any_order_and_ignore_unknown() {
        let a = parse_cni_args(
            "K8S_POD_UID=u;FOO=1;K8S_POD_NAME=web;IgnoreUnknown=1;K8S_POD_NAMESPACE=prod",
        )
        .unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("web"));
        assert_eq!(a.pod_namespace.as_deref(), Some("prod"));
        assert_eq!(parse_cni_args("").unwrap(), CniArgs::default());
        assert!(parse_cni_args("IgnoreUnknown=0;FOO=1").is_err());
        assert!(parse_cni_args("FOO=1;IgnoreUnknown=true").is_ok());
        assert_eq!(
            parse_cni_args("K8S_POD_NAME=a=b")
                .unwrap()
                .pod_name
                .as_deref(),
            Some("a=b")
        );
    }
}
