//! What a shared access signature allows, read from its own fields (`sp`, and for an
//! account SAS `ss` and `srt`) without a call: `ebb check` knows from it, with no side
//! effect, whether `ebb run` will be allowed to add messages and to create a queue that
//! does not exist yet (neither can be probed on the service without doing it).

use super::{AzureAccount, Credential};

/// A permission on a queue that ebb's calls need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuePermission {
    /// Create the queue (an account SAS's `c` or `w`, on containers).
    Create,
    /// Read its properties (the message count): `r`.
    Read,
    /// Add messages: `a`.
    Add,
    /// Get and delete messages: `p`.
    Process,
    /// Update a message's visibility: `u`.
    Update,
}

impl QueuePermission {
    /// What `ebb run` needs on every queue of a host: it creates each where missing, reads
    /// its count, adds (sends through the API, poisonings, answers), gets and deletes, and
    /// extends leases.
    pub const RUN: [QueuePermission; 5] =
        [QueuePermission::Create, QueuePermission::Read, QueuePermission::Add, QueuePermission::Process, QueuePermission::Update];

    /// The SAS letter and its name, as a 403 names it.
    pub fn as_str(self) -> &'static str {
        match self {
            QueuePermission::Create => "c (create)",
            QueuePermission::Read => "r (read)",
            QueuePermission::Add => "a (add)",
            QueuePermission::Process => "p (process)",
            QueuePermission::Update => "u (update)",
        }
    }

    /// Whether `sp` letters grant it.
    fn in_letters(self, letters: &str) -> bool {
        match self {
            QueuePermission::Create => letters.contains('c') || letters.contains('w'),
            QueuePermission::Read => letters.contains('r'),
            QueuePermission::Add => letters.contains('a'),
            QueuePermission::Process => letters.contains('p'),
            QueuePermission::Update => letters.contains('u'),
        }
    }

    /// The account SAS resource type it needs: `c` (container: the queue) or `o` (object:
    /// its messages).
    fn resource_type(self) -> char {
        match self {
            QueuePermission::Create | QueuePermission::Read => 'c',
            QueuePermission::Add | QueuePermission::Process | QueuePermission::Update => 'o',
        }
    }
}

/// The fields of a SAS that say what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SasGrant {
    /// `sp`: the permission letters.
    pub permissions: String,
    /// `ss` and `srt` of an account SAS; `None` for a queue (service) SAS, which is for one
    /// queue and can never create one.
    pub account: Option<(String, String)>,
}

impl SasGrant {
    /// The fields of SAS query `sas`; `None` when it has no `sp` (its permissions are in a
    /// stored access policy, `si`, that only the service can read).
    pub fn parse(sas: &str) -> Option<SasGrant> {
        let field = |name: &str| form_urlencoded::parse(sas.trim_start_matches('?').as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned());
        let permissions = field("sp")?;
        let account = field("srt").map(|types| (field("ss").unwrap_or_default(), types));
        Some(SasGrant { permissions, account })
    }

    /// Which of `needs` it does not grant, in their order.
    pub fn lacks(&self, needs: &[QueuePermission]) -> Vec<QueuePermission> {
        needs.iter().copied().filter(|need| !self.grants(*need)).collect()
    }

    fn grants(&self, need: QueuePermission) -> bool {
        match &self.account {
            Some((services, types)) => services.contains('q') && types.contains(need.resource_type()) && need.in_letters(&self.permissions),
            None => need != QueuePermission::Create && need.in_letters(&self.permissions),
        }
    }
}

impl AzureAccount {
    /// What its SAS allows, when its credential is a SAS that says so (see [`SasGrant::parse`]).
    pub fn sas_grant(&self) -> Option<SasGrant> {
        match self.credential() {
            Credential::Sas(sas) => SasGrant::parse(sas.secret()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use QueuePermission::*;

    #[test]
    fn a_sas_grants_what_its_letters_and_resource_types_say() {
        let cases = [
            ("account sas with all", "sv=2020-12-06&ss=q&srt=co&sp=raupc&sig=x", vec![]),
            ("write creates too", "ss=bq&srt=sco&sp=rwaup&sig=x", vec![]),
            ("read only", "ss=q&srt=co&sp=rl&sig=x", vec![Create, Add, Process, Update]),
            ("no process nor update", "ss=q&srt=co&sp=rac&sig=x", vec![Process, Update]),
            ("blobs only", "ss=b&srt=co&sp=raupc&sig=x", QueuePermission::RUN.to_vec()),
            ("queues but not their messages", "ss=q&srt=c&sp=raupc&sig=x", vec![Add, Process, Update]),
            ("a queue sas cannot create", "sv=2020-12-06&sp=raup&sig=x", vec![Create]),
        ];
        for (name, sas, lacking) in cases {
            assert_eq!(SasGrant::parse(sas).unwrap().lacks(&QueuePermission::RUN), lacking, "{name}");
        }
        assert_eq!(SasGrant::parse("sv=2020-12-06&si=policy&sig=x"), None, "a stored access policy's permissions are not in the SAS");
    }
}
