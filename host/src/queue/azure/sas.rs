//! What a shared access signature allows, read from its own fields (`sp`, and for an
//! account SAS `ss` and `srt`) without a call: `ebb check` knows from it, with no side
//! effect, whether `ebb run` will be allowed to add messages and to create a queue that
//! does not exist yet (neither can be probed on the service without doing it).

use anyhow::bail;

use super::{AzureAccount, Credential};

/// The longest SAS taken, in bytes. A real one is a few hundred bytes (a user delegation
/// SAS under a thousand); every request carries it in its URL, and a request line past
/// 16 KiB is refused by Azurite (431) and Azure's front end alike, past 64 KiB the URL
/// cannot even be built: each call would fail, retried as a broken connection.
pub const MAX_SAS_BYTES: usize = 8192;

/// The fields Azure Storage reads in a SAS (account, service and user delegation SAS), by
/// their lowercase names: the only spelling it reads.
const SAS_FIELDS: [&str; 32] = [
    "sv", "ss", "srt", "sp", "se", "st", "sip", "spr", "sig", "si", "sr", "ses", "sdd", "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid",
    "rscc", "rscd", "rsce", "rscl", "rsct", "tn", "spk", "srk", "epk", "erk",
];

/// Refuses a SAS query that Azure Storage would refuse at every call, naming the field:
/// one given twice (Azurite answers AuthenticationFailed; which copy a reader would take is
/// anyone's guess, so `ebb check` could not say what it allows), a field spelt in capitals
/// (`SP`: not read, so the SAS has no permissions), an account SAS with `srt` and no `ss`
/// (its services), and one over [`MAX_SAS_BYTES`]. (No `sp` nor `si` is left to the
/// probes: the calls are refused, and `ebb check` says so.)
/// `ebb run` and `ebb check` both read the connection string through it, so they refuse
/// the same SAS with the same words. Values are never shown: `sig` is a secret.
pub fn check_query(sas: &str) -> anyhow::Result<()> {
    if sas.len() > MAX_SAS_BYTES {
        bail!(
            "SharedAccessSignature of {} bytes: at most {MAX_SAS_BYTES} (a SAS is a few hundred bytes; every request's URL carries it, and a URL that long is refused)",
            sas.len()
        );
    }
    let mut seen: Vec<String> = Vec::new();
    for (key, _) in form_urlencoded::parse(sas.trim_start_matches('?').as_bytes()) {
        let lower = key.to_ascii_lowercase();
        if lower != key && SAS_FIELDS.contains(&lower.as_str()) {
            bail!("SharedAccessSignature field {key}: Azure Storage reads only the lowercase {lower}, so it would not be read");
        }
        if seen.iter().any(|k| *k == key) {
            bail!("SharedAccessSignature repeats {key}: Azure Storage refuses a SAS with a field given twice (AuthenticationFailed); give each field once");
        }
        seen.push(key.into_owned());
    }
    let has = |field: &str| seen.iter().any(|k| k == field);
    if has("srt") && !has("ss") {
        bail!("SharedAccessSignature has srt and no ss: an account SAS names its services (ss=q for queues)");
    }
    Ok(())
}

/// A permission on a queue that ebb's calls need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueuePermission {
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
pub(crate) struct SasGrant {
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
    pub(crate) fn sas_grant(&self) -> Option<SasGrant> {
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

    #[test]
    fn a_sas_azure_would_refuse_at_every_call_is_refused_naming_the_field() {
        let huge = format!("sv=2020-12-06&ss=q&srt=co&sp=raupc&sig=x&x={}", "A".repeat(MAX_SAS_BYTES));
        let cases = [
            ("sp twice, the first narrower", "ss=q&srt=co&sp=r&sp=raupc&sig=x", "repeats sp"),
            ("sp twice, the first wider", "ss=q&srt=co&sp=raupc&sp=r&sig=x", "repeats sp"),
            ("sig twice", "ss=q&srt=co&sp=raupc&sig=x&sig=y", "repeats sig"),
            ("ss twice", "ss=q&ss=b&srt=co&sp=raupc&sig=x", "repeats ss"),
            ("an empty sp twice", "sp=&sp=&sig=x", "repeats sp"),
            ("a field in capitals", "ss=q&srt=co&SP=raupc&sig=x", "field SP: Azure Storage reads only the lowercase sp"),
            ("srt in capitals", "ss=q&SRT=co&sp=raupc&sig=x", "field SRT"),
            ("srt without ss", "srt=co&sp=raupc&sig=x", "has srt and no ss"),
            ("huge", huge.as_str(), "bytes: at most 8192"),
        ];
        for (name, sas, reason) in cases {
            let error = check_query(sas).map(|()| "taken".to_string()).unwrap_or_else(|e| e.to_string());
            assert!(error.contains(reason), "{name}: expected {reason:?}, got {error:?}");
            assert!(!error.contains("raupc"), "{name}: no value is shown: {error}");
        }
        let taken = [
            ("an account SAS", "sv=2020-12-06&ss=q&srt=co&sp=raupc&se=2030-01-01T00%3A00%3A00Z&sig=x"),
            ("a leading ?", "?sv=2020-12-06&ss=q&srt=co&sp=raupc&sig=x"),
            ("a percent-encoded value (Azure decodes it: rau)", "ss=q&srt=co&sp=r%61u&sig=x"),
            ("unknown letters (Azurite ignores them)", "ss=q&srt=co&sp=rxaupc&sig=x"),
            ("a queue (service) SAS", "sv=2020-12-06&sp=raup&sig=x"),
            ("a stored access policy", "sv=2020-12-06&si=policy&sig=x"),
            ("an empty sp (it allows nothing: ebb check says so)", "ss=q&srt=co&sp=&sig=x"),
            ("another application's parameter", "ss=q&srt=co&sp=raupc&sig=x&Foo=1"),
        ];
        for (name, sas) in taken {
            assert!(check_query(sas).is_ok(), "{name}: {:?}", check_query(sas));
        }
        assert_eq!(SasGrant::parse("ss=q&srt=co&sp=r%61u&sig=x").unwrap().lacks(&QueuePermission::RUN), vec![Create, Process]);
    }
}
