//! The stable fuzz driver: every input of the checked-in corpus (`fuzz/corpus/<target>/`),
//! then a bounded property-based run per target (`FLEET_FUZZ_CASES`, default 10,000) on
//! random bytes and on mutations of corpus inputs.

use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let bytes = std::fs::read(&path).expect("corpus file");
            (path, bytes)
        })
        .collect();
    inputs.sort();
    inputs.into_iter().map(|(_, bytes)| bytes).collect()
}

fn cases() -> u32 {
    std::env::var("FLEET_FUZZ_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(10_000)
}

/// Random bytes, or a corpus input with a few bytes changed, cut or added.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let random = proptest::collection::vec(any::<u8>(), 0..2048);
    let mutated =
        (proptest::sample::select(seeds), proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8))
            .prop_map(|(mut bytes, edits)| {
                for (position, byte, kind) in edits {
                    let at = if bytes.is_empty() { 0 } else { position % (bytes.len() + 1) };
                    match kind {
                        0 if at < bytes.len() => bytes[at] = byte,
                        1 if at < bytes.len() => {
                            bytes.remove(at);
                        }
                        _ => bytes.insert(at, byte),
                    }
                }
                bytes
            });
    prop_oneof![1 => random, 3 => mutated]
}

fn run(target: &str) {
    let (_, fuzz) = fleet_fuzz::TARGETS.iter().find(|(name, _)| *name == target).expect("a target of that name");
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "the {target} corpus is empty");
    for seed in &seeds {
        fuzz(seed);
    }
    let config = Config { cases: cases(), failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    runner
        .run(&inputs(seeds), |input| {
            fuzz(&input);
            Ok(())
        })
        .unwrap_or_else(|error| panic!("{target}: {error}"));
}

#[test]
fn unit_file() {
    run("unit_file");
}

#[test]
fn service_directives() {
    run("service_directives");
}

#[test]
fn fleet_conf() {
    run("fleet_conf");
}

#[test]
fn api_request() {
    run("api_request");
}

#[test]
fn api_unverified() {
    run("api_unverified");
}

#[test]
fn page_token() {
    run("page_token");
}

#[test]
fn etcd_records() {
    run("etcd_records");
}

#[test]
fn tls_stream() {
    run("tls_stream");
}

#[test]
fn relayed_journal() {
    run("relayed_journal");
}

#[test]
fn calendar() {
    run("calendar");
}
