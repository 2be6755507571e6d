//! The parameter validation table, as a pure function: which values a
//! request may set, and the error (code, status, names) when it may not.
//! It runs before any run starts.

use std::collections::{BTreeMap, BTreeSet};

use bindery_params::{AgentParams, ParamValue, Values};
use bindery_spec::Scope;

use crate::error::{Code, ErrorKind, ServiceError};

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The bearer of the owner token.
    Owner,
    /// The bearer of a session token for this session.
    SessionToken(String),
    /// The bearer of the approver token: lists and answers pending
    /// approvals, and sees nothing else of a conversation.
    Approver,
    /// An end user, by their identity token: creates sessions that belong
    /// to them, and uses those only.
    EndUser(bindery_identity::Person),
    /// The holder of a share link of one session.
    Share(ShareHolder),
}

/// Who holds a share link: its session, its id, what it lets them do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareHolder {
    pub session: String,
    /// `sh_…`
    pub share: String,
    pub mode: bindery_store::model::ShareMode,
}

impl ShareHolder {
    /// What the holder of a share of this mode may do, as a refusal says.
    pub fn may(&self) -> &'static str {
        match self.mode {
            bindery_store::model::ShareMode::Read => {
                "a read-only share link may read the session, its events and its pending items; nothing else"
            }
            bindery_store::model::ShareMode::Write => {
                "a share link may read the session and its events, post messages and cancel a run; nothing else"
            }
        }
    }
}

impl Caller {
    /// A session token or a share link: a bearer of one session, who acts
    /// for nobody and answers, shares and sets nothing.
    pub fn of_one_session(&self) -> bool {
        matches!(self, Caller::SessionToken(_) | Caller::Share(_))
    }

    /// The end user calling, if it is one.
    pub fn subject(&self) -> Option<&bindery_identity::Subject> {
        match self {
            Caller::EndUser(p) => Some(&p.subject),
            _ => None,
        }
    }
}

/// Which request carries the values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A creation that starts a run (it has a prompt).
    Create,
    /// A creation that leaves the session idle: message-scope values,
    /// which only a run needs, are not required yet.
    CreateIdle,
    Fork,
    ForkIdle,
    Message,
    Resume,
    PutParams,
}

impl Op {
    fn starts_run_on_existing(self) -> bool {
        matches!(self, Op::Message | Op::Resume)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamsError {
    /// 422: names the agent does not declare.
    Unknown(Vec<String>),
    /// 403: names this caller may not set, and why.
    Forbidden(Vec<String>, String),
    /// 422: values of the wrong shape, and why (never the value).
    Invalid(Vec<String>, String),
    /// 422 on creation, 409 on an existing session: required names unbound;
    /// `per_message` those of them that are message-scope (only a message
    /// can carry them, PUT params refuses them).
    Required {
        names: Vec<String>,
        existing: bool,
        per_message: Vec<String>,
    },
}

impl ParamsError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ParamsError::Unknown(_) | ParamsError::Invalid(..) => ErrorKind::Invalid,
            ParamsError::Forbidden(..) => ErrorKind::Forbidden,
            ParamsError::Required { existing: true, .. } => ErrorKind::Conflict,
            ParamsError::Required {
                existing: false, ..
            } => ErrorKind::Invalid,
        }
    }

    pub fn code(&self) -> Code {
        match self {
            ParamsError::Unknown(_) => Code::UnknownParams,
            ParamsError::Forbidden(..) => Code::ForbiddenParams,
            ParamsError::Invalid(..) => Code::InvalidParams,
            ParamsError::Required { .. } => Code::ParamsRequired,
        }
    }

    pub fn names(&self) -> &[String] {
        match self {
            ParamsError::Unknown(n) | ParamsError::Forbidden(n, _) | ParamsError::Invalid(n, _) => {
                n
            }
            ParamsError::Required { names, .. } => names,
        }
    }

    pub fn message(&self) -> String {
        let names = self.names().join(", ");
        match self {
            ParamsError::Unknown(_) => format!("the agent declares no parameter named {names}"),
            ParamsError::Forbidden(_, why) => format!("{names}: {why}"),
            ParamsError::Invalid(_, why) => format!("{names}: {why}"),
            ParamsError::Required {
                existing: false, ..
            } => {
                format!("required parameters have no value: {names}; supply them in `params`")
            }
            ParamsError::Required {
                existing: true,
                names: all,
                per_message,
            } => {
                let per_session: Vec<&str> = all
                    .iter()
                    .filter(|n| !per_message.contains(n))
                    .map(String::as_str)
                    .collect();
                let mut how = Vec::new();
                if !per_message.is_empty() {
                    how.push(format!(
                        "send {} with the message, in its `params` (message scope: a value lasts one run, PUT /v1/sessions/:id/params does not take it)",
                        per_message.join(", ")
                    ));
                }
                if !per_session.is_empty() {
                    how.push(format!(
                        "the session's owner can supply {} with PUT /v1/sessions/:id/params or in the message's `params`",
                        per_session.join(", ")
                    ));
                }
                format!(
                    "required parameters are not bound: {names}; {}",
                    how.join("; ")
                )
            }
        }
    }
}

/// What a valid request changes.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Session-scope values after the request (secret ones included).
    pub session: Values,
    /// Message-scope values for the run this request starts.
    pub message: Values,
    /// Names the request changed, for the `params_changed` event.
    pub changed: Vec<String>,
}

/// Check `supplied` (name → JSON, `null` removes) against the agent's
/// declarations for `op` by `caller`, on a session whose current
/// session-scope values are `current` and whose session pins are
/// `session_pins`.
pub fn validate(
    params: &AgentParams,
    op: Op,
    caller: &Caller,
    sealed: bool,
    session_pins: &[String],
    current: &Values,
    supplied: &BTreeMap<String, serde_json::Value>,
) -> Result<Accepted, ParamsError> {
    let unknown: Vec<String> = supplied
        .keys()
        .filter(|k| params.decl(k).is_none())
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(ParamsError::Unknown(unknown));
    }
    let names: Vec<String> = supplied.keys().cloned().collect();
    if !names.is_empty() {
        match caller {
            Caller::SessionToken(_) => {
                return Err(ParamsError::Forbidden(
                    names,
                    "a session token cannot set parameters".into(),
                ));
            }
            Caller::Share(_) => {
                return Err(ParamsError::Forbidden(
                    names,
                    "a share link cannot set parameters".into(),
                ));
            }
            _ => {}
        }
        if *caller == Caller::Approver {
            return Err(ParamsError::Forbidden(
                names,
                "an approver answers pending calls and sets no parameters".into(),
            ));
        }
        if sealed && *caller != Caller::Owner {
            return Err(ParamsError::Forbidden(
                names,
                "the session is sealed: only its owner can change parameters".into(),
            ));
        }
    }
    let process: Vec<String> = names
        .iter()
        .filter(|n| params.decl(n).is_some_and(|d| d.scope == Scope::Process))
        .cloned()
        .collect();
    if !process.is_empty() {
        return Err(ParamsError::Forbidden(
            process,
            "process-scope parameters are set by the operator only".into(),
        ));
    }
    let pinned: Vec<String> = names
        .iter()
        .filter(|n| params.is_pinned(n))
        .cloned()
        .collect();
    if !pinned.is_empty() {
        return Err(ParamsError::Forbidden(
            pinned,
            "pinned by the operator; no client can override it".into(),
        ));
    }
    // A pinned secret this server no longer holds (after a restart, or
    // forgotten when idle) is given again by the owner, as any secret is.
    let lost_secret = |n: &String| {
        *caller == Caller::Owner
            && params.decl(n).is_some_and(|d| d.secret)
            && !current.contains_key(n)
            && !supplied[n].is_null()
    };
    let session_pinned: Vec<String> = names
        .iter()
        .filter(|n| session_pins.contains(n) && !lost_secret(n))
        .cloned()
        .collect();
    if !session_pinned.is_empty() {
        return Err(ParamsError::Forbidden(
            session_pinned,
            "pinned for this session: no request can change it; to change it, fork the session with a new pin (POST /v1/sessions/:id/fork with `pin`, or `session start --fork ID --pin NAME=VALUE`)".into(),
        ));
    }
    if op == Op::PutParams {
        let message: Vec<String> = names
            .iter()
            .filter(|n| params.decl(n).is_some_and(|d| d.scope == Scope::Message))
            .cloned()
            .collect();
        if !message.is_empty() {
            return Err(ParamsError::Invalid(
                message,
                "message-scope parameters last one run; send them with a message, not with PUT params".into(),
            ));
        }
    }
    let mut out = Accepted {
        session: current.clone(),
        changed: names.clone(),
        ..Default::default()
    };
    let mut not_strings = BTreeSet::new();
    for (name, raw) in supplied {
        let decl = params.decl(name).expect("unknown names were refused above");
        let target = match decl.scope {
            Scope::Session => &mut out.session,
            Scope::Message => &mut out.message,
            Scope::Process => unreachable!("process-scope names were refused above"),
        };
        if raw.is_null() {
            target.remove(name);
            continue;
        }
        match ParamValue::for_parameter(decl.secret, raw.clone()) {
            Ok(v) => {
                target.insert(name.clone(), v);
            }
            Err(_) => {
                not_strings.insert(name.clone());
            }
        }
    }
    if !not_strings.is_empty() {
        return Err(ParamsError::Invalid(
            not_strings.into_iter().collect(),
            "a secret parameter takes a string".into(),
        ));
    }
    if op != Op::PutParams {
        let snapshot = params.snapshot(&out.session, &out.message);
        let runs = !matches!(op, Op::CreateIdle | Op::ForkIdle);
        let missing: Vec<String> = params
            .missing_required(&snapshot)
            .into_iter()
            .filter(|n| runs || params.decl(n).is_some_and(|d| d.scope != Scope::Message))
            .collect();
        if !missing.is_empty() {
            let per_message = missing
                .iter()
                .filter(|n| params.decl(n).is_some_and(|d| d.scope == Scope::Message))
                .cloned()
                .collect();
            return Err(ParamsError::Required {
                names: missing,
                existing: op.starts_run_on_existing(),
                per_message,
            });
        }
    }
    Ok(out)
}

/// A refusal of values as the service answers it.
impl From<ParamsError> for ServiceError {
    fn from(e: ParamsError) -> Self {
        ServiceError {
            kind: e.kind(),
            code: e.code(),
            message: e.message(),
            params: e.names().to_vec(),
            extra: None,
        }
    }
}

#[cfg(test)]
mod tests;
