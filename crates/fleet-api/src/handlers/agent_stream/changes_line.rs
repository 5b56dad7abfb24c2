//! The manager's line of changes on a second-version stream: the machine's work with it, and
//! the bodies the stream has not carried before, each body's encoding shared by every stream
//! ([`crate::encoded_bodies`]). A line that would be too long for the agent goes without them.

use std::sync::Arc;

use fleet_api_schema::{AgentChanges, AgentWork, JournalAsk, MAX_CHANGE_STREAM_LINE};
use fleet_core::UnitHash;
use fleet_registry::{AgentRegistry, MachineWork};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::encoded_bodies::{EncodedBodies, EncodedBody};
use crate::handlers::agent_facet::work_to_schema;

/// What one stream has carried to its agent.
#[derive(Default)]
pub(super) struct Carried {
    /// The revision of the last line of changes.
    pub revision: u64,
    /// The body hashes of the work it last told (sorted), which the agent holds or has read:
    /// `None` before the first, when the agent is taken to hold what it had read before.
    hashes: Option<Vec<UnitHash>>,
}

/// [`AgentChanges`] as the manager writes it, the bodies' encodings spliced in.
#[derive(Serialize)]
struct Line<'a> {
    revision: u64,
    #[serde(skip_serializing_if = "<[JournalAsk]>::is_empty")]
    journal: &'a [JournalAsk],
    work: &'a AgentWork,
    #[serde(skip_serializing_if = "<[&RawValue]>::is_empty")]
    bodies: Vec<&'a RawValue>,
}

/// The line that tells the agent `revision` and `journal` only (a first-version stream, or
/// work the line cannot carry).
pub(super) fn bare(revision: u64, journal: Vec<JournalAsk>) -> Vec<u8> {
    encode_line(&AgentChanges { revision, journal, ..AgentChanges::default() })
}

/// `value` as a line.
pub(super) fn encode_line(value: &impl Serialize) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The line that tells `machine`'s agent `revision`, `journal`, its work and the bodies new to
/// the stream; the bare line when the work cannot be read or the line would be too long (the
/// agent then reads what it lacks).
pub(super) async fn with_work(
    agents: &Arc<dyn AgentRegistry>,
    bodies: &EncodedBodies,
    machine: &str,
    revision: u64,
    journal: Vec<JournalAsk>,
    carried: &mut Carried,
) -> Vec<u8> {
    carried.revision = revision;
    let work = match crate::handlers::agent_facet::served_work(agents, machine).await {
        Ok(work) => work,
        Err(error) => {
            tracing::debug!(%error, machine, "the stream's work could not be read: the agent reads it");
            carried.hashes = None;
            return bare(revision, journal);
        }
    };
    let hashes = hashes_of(&work);
    let new: Vec<UnitHash> = match &carried.hashes {
        None => Vec::new(),
        Some(before) => hashes.iter().filter(|hash| before.binary_search(hash).is_err()).copied().collect(),
    };
    carried.hashes = Some(hashes);
    let encoded = encoded_bodies(agents, bodies, machine, &new).await;
    let work = work_to_schema(work);
    let line = encode_line(&Line {
        revision,
        journal: &journal,
        work: &work,
        bodies: encoded.iter().map(|body| body.as_ref()).collect(),
    });
    if line.len() > MAX_CHANGE_STREAM_LINE {
        return bare(revision, journal);
    }
    fleet_metrics::metrics().pull.stream_works.inc();
    line
}

/// The sorted, distinct body hashes of `work`.
fn hashes_of(work: &MachineWork) -> Vec<UnitHash> {
    let mut hashes: Vec<UnitHash> = work.scheduled.iter().chain(&work.globals).map(|unit| unit.hash).collect();
    hashes.sort_unstable();
    hashes.dedup();
    hashes
}

/// The encodings of the bodies of `hashes`, encoded only where no stream encoded them yet;
/// a body that cannot be read is left out (the agent reads it).
async fn encoded_bodies(
    agents: &Arc<dyn AgentRegistry>,
    bodies: &EncodedBodies,
    machine: &str,
    hashes: &[UnitHash],
) -> Vec<EncodedBody> {
    let mut encoded = Vec::with_capacity(hashes.len());
    let mut unencoded = Vec::new();
    for hash in hashes {
        match bodies.get(hash) {
            Some(body) => encoded.push(body),
            None => unencoded.push(*hash),
        }
    }
    if unencoded.is_empty() {
        return encoded;
    }
    match agents.unit_bodies(machine, &unencoded).await {
        Ok(files) => encoded.extend(files.into_iter().filter_map(|(hash, file)| bodies.encode(hash, file))),
        Err(error) => tracing::debug!(%error, machine, "bodies could not be read for the stream: the agent reads them"),
    }
    encoded
}
