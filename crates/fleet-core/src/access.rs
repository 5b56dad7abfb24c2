//! Who may do what: the roles an identity holds and the one rule that decides whether a
//! role may take an action. Every API request is checked by [`decide`], and nothing else.

use std::fmt;

use crate::glob::Glob;

/// What an identity may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Everything, credentials included.
    Admin,
    /// Unit lifecycle and machine metadata; with a scope, only units whose names match it
    /// (the others are invisible to it). It sets and names in its units only the secrets
    /// `secrets` covers (none without it).
    Operator { units: Option<UnitScope>, secrets: Option<UnitScope> },
    /// Reading only: units, states, machines and journals.
    Viewer,
    /// A machine of the cluster that joined as a pull agent, by the certificate the cluster's
    /// agent CA gave it: it renews that certificate, and nothing else through this API.
    Machine { id: String },
    /// Whoever presents a registration token: it may join, and do nothing else.
    Joining,
    /// A git forge announcing a push to one source, by a body signed with that source's
    /// shared secret (verified before the role is given): it may ask that source to sync, and
    /// do nothing else.
    Webhook { source: String },
}

/// A unit-name pattern an operator is limited to (`web-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitScope {
    pattern: String,
    glob: Glob,
}

impl UnitScope {
    /// `None` when `pattern` is not a valid pattern (or is empty).
    pub fn new(pattern: &str) -> Option<Self> {
        if pattern.is_empty() || pattern.len() > 255 {
            return None;
        }
        Glob::new(pattern).map(|glob| Self { pattern: pattern.to_string(), glob })
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn covers(&self, unit: &str) -> bool {
        self.glob.matches(unit)
    }
}

/// A role name that is not one of `admin`, `operator`, `viewer`, or a scope that is not a
/// valid pattern, or a scope on a role that takes none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    #[error("unknown role {0:?}: expected admin, operator or viewer")]
    UnknownRole(String),
    #[error("invalid unit pattern {0:?}")]
    BadScope(String),
    #[error("only the operator role can be limited to units")]
    ScopeNotAllowed,
    #[error("invalid secret pattern {0:?}")]
    BadSecretScope(String),
    #[error("only the operator role is given secrets by pattern (an admin has them all, a viewer none)")]
    SecretScopeNotAllowed,
}

impl Role {
    /// The role `name` names, limited to `units` (operators only).
    pub fn parse(name: &str, units: Option<&str>) -> Result<Self, RoleError> {
        let scope = match units {
            None | Some("") => None,
            Some(pattern) => Some(UnitScope::new(pattern).ok_or_else(|| RoleError::BadScope(pattern.to_string()))?),
        };
        match (name, scope) {
            ("admin", None) => Ok(Self::Admin),
            ("viewer", None) => Ok(Self::Viewer),
            ("operator", units) => Ok(Self::Operator { units, secrets: None }),
            ("admin" | "viewer", Some(_)) => Err(RoleError::ScopeNotAllowed),
            (other, _) => Err(RoleError::UnknownRole(other.to_string())),
        }
    }

    /// This operator role, given the secrets `pattern` covers (`None` or empty: none).
    pub fn with_secrets(self, pattern: Option<&str>) -> Result<Self, RoleError> {
        let pattern = match pattern {
            None | Some("") => return Ok(self),
            Some(pattern) => pattern,
        };
        let scope = UnitScope::new(pattern).ok_or_else(|| RoleError::BadSecretScope(pattern.to_string()))?;
        match self {
            Self::Operator { units, .. } => Ok(Self::Operator { units, secrets: Some(scope) }),
            _ => Err(RoleError::SecretScopeNotAllowed),
        }
    }

    /// The secret pattern an operator is given, if any.
    pub fn secret_scope(&self) -> Option<&str> {
        match self {
            Self::Operator { secrets: Some(scope), .. } => Some(scope.pattern()),
            _ => None,
        }
    }

    /// Whether the role may set, remove and name in its units the secret `name`.
    pub fn holds_secret(&self, name: &str) -> bool {
        match self {
            Self::Admin => true,
            Self::Operator { secrets: Some(scope), .. } => scope.covers(name),
            _ => false,
        }
    }

    /// The role's name, without its scope.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Operator { .. } => "operator",
            Self::Viewer => "viewer",
            Self::Machine { .. } => "machine",
            Self::Joining => "joining",
            Self::Webhook { .. } => "webhook",
        }
    }

    /// The unit pattern the role is limited to, if any.
    pub fn scope(&self) -> Option<&str> {
        match self {
            Self::Operator { units: Some(scope), .. } => Some(scope.pattern()),
            _ => None,
        }
    }

    /// Whether the role sees `unit` at all (in lists, states and journals).
    pub fn sees_unit(&self, unit: &str) -> bool {
        match self {
            Self::Operator { units: Some(scope), .. } => scope.covers(unit),
            Self::Machine { .. } | Self::Joining | Self::Webhook { .. } => false,
            _ => true,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.scope()) {
            (Self::Machine { id }, _) => write!(f, "machine({id})"),
            (Self::Webhook { source }, _) => write!(f, "webhook({source})"),
            (_, Some(scope)) => write!(f, "{}({scope})", self.name()),
            (_, None) => f.write_str(self.name()),
        }
    }
}

/// What a request does, as far as authorization cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// Lists (units, states, machines) and the discovery document; lists are filtered by
    /// [`Role::sees_unit`].
    List,
    /// Reads one unit, its state or its journal.
    ReadUnit(&'a str),
    /// Creates, changes or destroys one unit.
    WriteUnit(&'a str),
    /// Creates or changes many units at once; each of them is then checked as
    /// [`Action::WriteUnit`] before anything is written.
    WriteUnits,
    /// Changes machine metadata.
    WriteMachines,
    /// Creates, lists or revokes credentials.
    ManageCredentials,
    /// Joins the cluster as a machine, with a registration token.
    Join,
    /// Renews the caller's own machine certificate.
    RenewMachine,
    /// The agent's side of the store for one machine: its presence, its work, the bodies of
    /// its units, its units' states (what a pull agent does through its manager).
    MachineFacet(&'a str),
    /// Reads the metrics, which count every unit of the cluster (so not for an operator
    /// limited to some units).
    ReadMetrics,
    /// Lists git sources and their status (which name units of any scope).
    ReadSources,
    /// Adds, changes, pauses, syncs or removes a git source: a source writes any unit, and
    /// its sync reads files on the machines that run it, so only an admin may.
    ManageSources,
    /// Starts, pauses, resumes, undoes or removes a rollout (which writes the units it names,
    /// any of them: not for an operator limited to some units).
    ManageRollouts,
    /// A push webhook for the source named: syncs it.
    SourceWebhook(&'a str),
    /// Takes a snapshot of the whole store, every credential's hash in it: administrators only.
    BackUp,
    /// Takes over units from the original fleet's registry with the machines they run on,
    /// which is the engine's to decide otherwise: administrators only.
    Import,
    /// Lists the secrets: their names, versions, sizes, who set them and when; never a value.
    ListSecrets,
    /// Sets or removes the secret named (an operator: one its secret pattern covers).
    WriteSecret(&'a str),
}

impl Action<'_> {
    /// The unit the action concerns, if one.
    pub fn unit(&self) -> Option<&str> {
        match self {
            Self::ReadUnit(unit) | Self::WriteUnit(unit) => Some(unit),
            _ => None,
        }
    }
}

/// The answer to "may this role do this?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// The role may not know the unit exists: a read answers as if it did not. (A write of
    /// such a unit is [`Access::Denied`], whether or not the unit exists, which tells nothing.)
    Hidden,
    /// The role may not do this.
    Denied,
}

/// Decides whether `role` may take `action`. Every pair allowed is written here; anything
/// else is denied.
pub fn decide(role: &Role, action: Action<'_>) -> Access {
    use Action as A;
    let outside_scope = action.unit().is_some_and(|unit| !role.sees_unit(unit));
    match (role, action) {
        // Joining takes a registration token, renewing a machine certificate, a machine's
        // side of the store that machine's certificate, a webhook that source's signature: no
        // other credential stands in for them, and they stand in for no other.
        (Role::Joining, A::Join) | (Role::Machine { .. }, A::RenewMachine) => Access::Allowed,
        (Role::Machine { id }, A::MachineFacet(machine)) if id == machine => Access::Allowed,
        (Role::Webhook { source }, A::SourceWebhook(name)) if source == name => Access::Allowed,
        (
            Role::Admin,
            A::List
            | A::ReadUnit(_)
            | A::WriteUnit(_)
            | A::WriteUnits
            | A::WriteMachines
            | A::ManageCredentials
            | A::ReadMetrics
            | A::ReadSources
            | A::ManageSources
            | A::ManageRollouts
            | A::BackUp
            | A::Import
            | A::ListSecrets
            | A::WriteSecret(_),
        ) => Access::Allowed,
        (Role::Operator { .. }, A::WriteSecret(name)) if role.holds_secret(name) => Access::Allowed,
        (Role::Operator { .. } | Role::Viewer, A::ListSecrets) => Access::Allowed,
        (Role::Operator { .. } | Role::Viewer, A::ReadUnit(_)) if outside_scope => Access::Hidden,
        (Role::Operator { .. }, A::WriteUnit(_)) if outside_scope => Access::Denied,
        (Role::Operator { .. }, A::List | A::ReadUnit(_) | A::WriteUnit(_) | A::WriteUnits) => Access::Allowed,
        // A machine's drain and metadata move every unit on it, or that asks for it: an
        // operator limited to some units touches no machine (issue 67).
        (
            Role::Operator { units: None, .. },
            A::ReadMetrics | A::ReadSources | A::ManageRollouts | A::WriteMachines,
        ) => Access::Allowed,
        (Role::Viewer, A::List | A::ReadUnit(_) | A::ReadMetrics | A::ReadSources) => Access::Allowed,
        _ => Access::Denied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator(scope: &str) -> Role {
        Role::parse("operator", Some(scope)).expect("valid scope")
    }

    #[test]
    fn every_role_against_every_action() {
        use Access::{Allowed as A, Denied as D};
        let actions = [
            Action::List,
            Action::ReadUnit("web-1.service"),
            Action::WriteUnit("web-1.service"),
            Action::WriteMachines,
            Action::ManageCredentials,
            Action::Join,
            Action::RenewMachine,
            Action::MachineFacet("m1"),
            Action::MachineFacet("m2"),
            Action::ReadMetrics,
            Action::ReadSources,
            Action::ManageSources,
            Action::SourceWebhook("docs"),
            Action::ManageRollouts,
            Action::WriteUnits,
            Action::SourceWebhook("web"),
            Action::BackUp,
            Action::ListSecrets,
            Action::WriteSecret("web-db"),
            Action::WriteSecret("billing-key"),
            Action::Import,
        ];
        let web_secrets = operator("web-*").with_secrets(Some("web-*")).expect("a secret scope");
        let table: [(Role, [Access; 21]); 8] = [
            (Role::Admin, [A, A, A, A, A, D, D, D, D, A, A, A, D, A, A, D, A, A, A, A, A]),
            (
                Role::Operator { units: None, secrets: None },
                [A, A, A, A, D, D, D, D, D, A, A, D, D, A, A, D, D, A, D, D, D],
            ),
            (operator("web-*"), [A, A, A, D, D, D, D, D, D, D, D, D, D, D, A, D, D, A, D, D, D]),
            (web_secrets, [A, A, A, D, D, D, D, D, D, D, D, D, D, D, A, D, D, A, A, D, D]),
            (Role::Viewer, [A, A, D, D, D, D, D, D, D, A, A, D, D, D, D, D, D, A, D, D, D]),
            (Role::Machine { id: "m1".into() }, [D, D, D, D, D, D, A, A, D, D, D, D, D, D, D, D, D, D, D, D, D]),
            (Role::Joining, [D, D, D, D, D, A, D, D, D, D, D, D, D, D, D, D, D, D, D, D, D]),
            (Role::Webhook { source: "docs".into() }, [D, D, D, D, D, D, D, D, D, D, D, D, A, D, D, D, D, D, D, D, D]),
        ];
        for (role, expected) in table {
            for (action, want) in actions.iter().zip(expected) {
                assert_eq!(decide(&role, *action), want, "{role} {action:?}");
            }
        }
    }

    #[test]
    fn a_scoped_operator_neither_sees_nor_touches_other_units() {
        let role = operator("web-*");
        assert_eq!(decide(&role, Action::ReadUnit("db.service")), Access::Hidden);
        assert_eq!(decide(&role, Action::WriteUnit("db.service")), Access::Denied);
        // Regression (issue 67): it drained any machine, moving units outside its pattern.
        assert_eq!(decide(&role, Action::WriteMachines), Access::Denied, "a drain moves every unit of a machine");
        assert!(role.sees_unit("web-2.service"));
        assert!(!role.sees_unit("db.service"));
        assert_eq!(role.to_string(), "operator(web-*)");
    }

    #[test]
    fn role_names_and_scopes_are_validated() {
        assert_eq!(Role::parse("admin", None), Ok(Role::Admin));
        assert_eq!(Role::parse("viewer", Some("")), Ok(Role::Viewer));
        assert_eq!(Role::parse("root", None), Err(RoleError::UnknownRole("root".into())));
        assert_eq!(Role::parse("viewer", Some("web-*")), Err(RoleError::ScopeNotAllowed));
        assert_eq!(Role::parse("operator", Some("[")), Err(RoleError::BadScope("[".into())));
        assert_eq!(
            Role::parse("operator", Some("web-*")).map(|role| role.scope().map(str::to_string)),
            Ok(Some("web-*".into()))
        );
    }
}
