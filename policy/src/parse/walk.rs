//! Walking a value tree with the field path at hand, plus pieces shared by the formats.

use crate::selector::{Operator, Requirement, Selector};
use ipnet::IpNet;
use serde_json::{Map, Value};
use std::cell::Cell;
use std::net::IpAddr;

/// An error at a field path inside one rule or object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path with `[i]` indices.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// Builds an error.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

pub type Res<T> = Result<T, FieldError>;

thread_local! {
    /// Whether field paths are built. They are only read in errors, and building one string per
    /// object and list element is a third of the parsing time of a large file; so
    /// `parse_policy_file` parses without them first and again with them only to report an
    /// error (parsing is deterministic: the second pass fails at the same place).
    static PATHS: Cell<bool> = const { Cell::new(true) };
}

/// What a parse noted without failing: an input the API accepts that Weft reads with a
/// caveat ([`NoteKind::Warning`], e.g. a CIDR with host bits set, masked), or, when parsing a
/// cluster object leniently, a part Weft cannot enforce and left out
/// ([`NoteKind::NotEnforced`]: fail closed, see [`super::parse_cluster_object`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Note {
    /// What kind of note.
    pub kind: NoteKind,
    /// Dotted field path with `[i]` indices.
    pub path: String,
    /// What happened, and what it means for enforcement.
    pub message: String,
}

/// See [`Note`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoteKind {
    /// Enforced as the API means it; worth telling the author.
    Warning,
    /// Not enforced: the part allows nothing (an allow) or is widened to deny everything in
    /// its direction (a deny).
    NotEnforced,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

thread_local! {
    /// Notes of the parse running on this thread (`None`: nobody collects them).
    static NOTES: std::cell::RefCell<Option<Vec<Note>>> = const { std::cell::RefCell::new(None) };
    /// Whether an entry that cannot be expressed is left out (noted) instead of failing.
    static LENIENT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` collecting its notes; `lenient` turns inexpressible entries into
/// [`NoteKind::NotEnforced`] notes instead of errors.
pub fn collecting_notes<T>(lenient: bool, f: impl FnOnce() -> T) -> (T, Vec<Note>) {
    /// Restores the previous state also when `f` panics (the thread may be a pooled worker).
    struct Restore(Option<Vec<Note>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NOTES.with(|n| *n.borrow_mut() = self.0.take());
            LENIENT.with(|l| l.set(self.1));
        }
    }
    let prev_notes = NOTES.with(|n| n.borrow_mut().replace(Vec::new()));
    let prev_lenient = LENIENT.with(|l| l.replace(lenient));
    let restore = Restore(prev_notes, prev_lenient);
    let out = f();
    let notes = NOTES.with(|n| n.borrow_mut().take()).unwrap_or_default();
    drop(restore);
    (out, notes)
}

/// How many notes the running parse has made so far.
pub fn notes_len() -> usize {
    NOTES.with(|n| n.borrow().as_ref().map_or(0, Vec::len))
}

/// Prefixes the paths of the notes made since [`notes_len`] was `from` with `location` (the
/// rule or object they belong to). Not in lenient mode: a cluster object is parsed alone, and
/// its status already names it.
pub fn locate_notes_since(from: usize, location: &str) {
    if location.is_empty() || lenient() {
        return;
    }
    NOTES.with(|n| {
        if let Some(v) = n.borrow_mut().as_mut() {
            for note in v.iter_mut().skip(from) {
                note.path = if note.path.is_empty() {
                    location.to_owned()
                } else {
                    format!("{location}: {}", note.path)
                };
            }
        }
    });
}

/// Whether the running parse leaves inexpressible entries out instead of failing.
pub fn lenient() -> bool {
    LENIENT.with(Cell::get)
}

/// Records a note, if anyone collects them.
pub fn note(kind: NoteKind, path: &str, message: impl Into<String>) {
    NOTES.with(|n| {
        if let Some(v) = n.borrow_mut().as_mut() {
            v.push(Note {
                kind,
                path: path.to_owned(),
                message: message.into(),
            });
        }
    });
}

/// Records an entry left out in lenient mode.
pub fn not_enforced(e: &FieldError, what: &str) {
    note(
        NoteKind::NotEnforced,
        &e.path,
        format!("{}; {what}", e.message),
    );
}

/// Runs `f` with field paths off (they come out empty).
pub fn without_paths<T>(f: impl FnOnce() -> T) -> T {
    /// Restores the flag also when `f` panics (the thread may be a pooled worker).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            PATHS.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PATHS.with(|p| p.replace(false)));
    f()
}

fn paths() -> bool {
    PATHS.with(Cell::get)
}

/// Appends a field name to a path.
pub fn join(path: &str, field: &str) -> String {
    if !paths() {
        String::new()
    } else if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// An object being read: fields are taken one by one and [`Obj::finish`] reports the rest.
pub struct Obj<'v> {
    map: &'v Map<String, Value>,
    path: String,
    /// Fields taken so far (objects have a handful: a list beats hashing).
    taken: Vec<&'static str>,
}

impl<'v> Obj<'v> {
    /// Opens `v` as an object; YAML's empty value (`ingress:\n  - `) counts as `{}`.
    pub fn new(v: &'v Value, path: &str) -> Res<Self> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match v {
            Value::Object(m) => m,
            Value::Null => EMPTY.get_or_init(Map::new),
            other => {
                return Err(FieldError::new(
                    path,
                    format!("expected an object, got {}", kind(other)),
                ));
            }
        };
        Ok(Self {
            map,
            path: path.to_owned(),
            taken: Vec::new(),
        })
    }

    /// Path of a field of this object.
    pub fn at(&self, field: &str) -> String {
        join(&self.path, field)
    }

    /// Takes a field; `null` counts as absent.
    pub fn get(&mut self, field: &'static str) -> Option<&'v Value> {
        if !self.taken.contains(&field) {
            self.taken.push(field);
        }
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// True when the field is present (even if null).
    pub fn has(&self, field: &str) -> bool {
        self.map.contains_key(field)
    }

    /// Takes an optional string field.
    pub fn str(&mut self, field: &'static str) -> Res<Option<&'v str>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(FieldError::new(
                self.at(field),
                format!("expected a string, got {}", kind(other)),
            )),
        }
    }

    /// Takes an optional array field, with the path of each element.
    pub fn array(&mut self, field: &'static str) -> Res<Option<Vec<(String, &'v Value)>>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                let base = self.at(field);
                let on = paths();
                Ok(Some(
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| {
                            let p = if on {
                                format!("{base}[{i}]")
                            } else {
                                String::new()
                            };
                            (p, v)
                        })
                        .collect(),
                ))
            }
            Some(other) => Err(FieldError::new(
                self.at(field),
                format!("expected a list, got {}", kind(other)),
            )),
        }
    }

    /// Takes an optional boolean field.
    pub fn bool(&mut self, field: &'static str) -> Res<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(FieldError::new(
                self.at(field),
                format!("expected true or false, got {}", kind(other)),
            )),
        }
    }

    /// Rejects fields not taken: `unsupported` lists fields the format defines but Weft does
    /// not implement; anything else is unknown (Cilium rejects unknown fields too).
    pub fn finish(self, unsupported: &[&str]) -> Res<()> {
        let mut rest: Vec<&String> = self
            .map
            .keys()
            .filter(|k| !self.taken.contains(&k.as_str()))
            .collect();
        rest.sort();
        if let Some(k) = rest.iter().find(|k| unsupported.contains(&k.as_str())) {
            return Err(FieldError::new(
                self.at(k),
                format!("not supported yet: field {k:?}"),
            ));
        }
        match rest.first() {
            None => Ok(()),
            Some(k) => Err(FieldError::new(self.at(k), format!("unknown field {k:?}"))),
        }
    }
}

/// A short name of a value's type for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A Kubernetes label selector (`matchLabels`, `matchExpressions`).
pub fn selector(v: &Value, path: &str) -> Res<Selector> {
    let mut o = Obj::new(v, path)?;
    let mut sel = Selector::all();
    if let Some(ml) = o.get("matchLabels") {
        let p = o.at("matchLabels");
        let Value::Object(m) = ml else {
            return Err(FieldError::new(
                p,
                format!("expected an object, got {}", kind(ml)),
            ));
        };
        for (k, val) in m {
            let val = scalar_string(val)
                .ok_or_else(|| FieldError::new(join(&p, k), "expected a string value"))?;
            check_key(k, &join(&p, k))?;
            crate::labels::check_value(&val)
                .map_err(|e| FieldError::new(join(&p, k), e.to_string()))?;
            sel.add_match(k, &val);
        }
    }
    for (p, e) in o.array("matchExpressions")?.unwrap_or_default() {
        sel.add(expression(e, &p)?);
    }
    o.finish(&[])?;
    Ok(sel)
}

fn check_key(k: &str, path: &str) -> Res<()> {
    if k.is_empty() || k.ends_with(':') {
        return Err(FieldError::new(path, "empty label key"));
    }
    crate::labels::check_key(k).map_err(|e| FieldError::new(path, e.to_string()))
}

/// YAML turns `role: 1` or `on: yes` into numbers and booleans; label values are strings.
fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

fn expression(v: &Value, path: &str) -> Res<Requirement> {
    let mut o = Obj::new(v, path)?;
    let key = o
        .str("key")?
        .ok_or_else(|| FieldError::new(o.at("key"), "missing"))?;
    check_key(key, &o.at("key"))?;
    let op_path = o.at("operator");
    let op = o
        .str("operator")?
        .ok_or_else(|| FieldError::new(&op_path, "missing"))?;
    let values: crate::sorted::Set<String> = o
        .array("values")?
        .unwrap_or_default()
        .into_iter()
        .map(|(p, val)| scalar_string(val).ok_or_else(|| FieldError::new(p, "expected a string")))
        .collect::<Res<_>>()?;
    let vpath = o.at("values");
    o.finish(&[])?;
    let op = match op {
        "In" | "NotIn" if values.is_empty() => {
            return Err(FieldError::new(
                vpath,
                format!("operator {op} needs at least one value"),
            ));
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            return Err(FieldError::new(
                vpath,
                format!("operator {op} takes no values"),
            ));
        }
        "In" => Operator::In(values),
        "NotIn" => Operator::NotIn(values),
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(FieldError::new(
                op_path,
                format!("unknown operator {other:?} (expected In, NotIn, Exists or DoesNotExist)"),
            ));
        }
    };
    Ok(Requirement::new(key, op))
}

/// Whose CIDR syntax a prefix follows. Both accept host bits and mean the masked network:
/// Cilium's `netip.ParsePrefix`, then `Masked()` (`pkg/labels/cidr.IPStringToLabel`);
/// Kubernetes' `netutils.ParseCIDRSloppy` (the API server only warns). The flavor only changes
/// the warning's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidrFlavor {
    /// `toCIDR`, `toCIDRSet` and their `from` forms.
    Cilium,
    /// A `NetworkPolicy`'s `ipBlock`.
    Kubernetes,
}

/// A prefix; a bare address means a host prefix. Host bits are masked, as both APIs do, with
/// a [`NoteKind::Warning`]. (IPv4 octets with leading zeros are read as decimal, as
/// Kubernetes' sloppy parser does.)
pub fn cidr(v: &Value, path: &str, flavor: CidrFlavor) -> Res<IpNet> {
    let Value::String(s) = v else {
        return Err(FieldError::new(
            path,
            format!("expected a CIDR string, got {}", kind(v)),
        ));
    };
    let net = match s.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(a) => IpNet::from(a),
            Err(_) => {
                return Err(FieldError::new(
                    path,
                    format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8)"),
                ));
            }
        },
    };
    let masked = net.trunc();
    if masked != net {
        let api = match flavor {
            CidrFlavor::Cilium => "as Cilium does",
            CidrFlavor::Kubernetes => "as Kubernetes does",
        };
        note(
            NoteKind::Warning,
            path,
            format!(
                "{s:?} has host bits set: enforced as {masked}, the network it names, {api} (write {masked})"
            ),
        );
    }
    Ok(masked)
}
