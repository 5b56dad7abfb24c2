//! Several real fleetds sharing one real etcd: distinct machine IDs, public IPs and
//! metadata, short lease lifetimes so machine loss shows within seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet_testkit::EtcdServer;

use crate::Fleetd;

/// How long a dead member's presence lasts in the cluster tests.
pub const AGENT_TTL_SECONDS: u64 = 4;
/// The engine's fallback period; its leadership lasts five of these.
pub const ENGINE_RECONCILE_SECONDS: f64 = 0.5;

pub struct Cluster {
    pub etcd: EtcdServer,
    pub members: Vec<Fleetd>,
}

/// Where the API says each unit is: unit → (machine ID, current state).
pub type Placement = BTreeMap<String, (Option<String>, String)>;

/// The machine ID of member `index`: its first 8 characters (the short ID) differ per member.
pub fn member_id(index: usize) -> String {
    format!("{:08x}{}", index + 1, "c0ffee00c0ffee00c0ffee00")
}

impl Cluster {
    /// Starts etcd and `size` fleetds; member `i` has `public_ip = 127.0.0.<i+1>`, metadata
    /// `member=<i>`, and then the fleet.conf lines `extra(i)` (which win over those).
    pub fn start(size: usize, extra: impl Fn(usize) -> Vec<(String, String)>) -> Self {
        Self::on(EtcdServer::start(), size, extra)
    }

    /// As [`Cluster::start`], on a given etcd.
    pub fn on(etcd: EtcdServer, size: usize, extra: impl Fn(usize) -> Vec<(String, String)>) -> Self {
        let mut cluster = Self { etcd, members: Vec::new() };
        for index in 0..size {
            cluster.add_member(index, &extra(index));
        }
        // A member answers before the others' presence reaches its copy: a test that reads
        // the machines, or places units by them, starts once every member is listed.
        cluster.wait_until("every member is listed", Duration::from_secs(30), |cluster| {
            cluster.any().ok(&["list-machines", "--no-legend"]).stdout.lines().count() >= size
        });
        cluster
    }

    /// The fleet.conf lines every member shares, with this member's own address and metadata.
    pub fn member_config(&self, index: usize) -> Vec<(String, String)> {
        vec![
            ("etcd_servers".into(), self.etcd.endpoint()),
            ("public_ip".into(), format!("127.0.0.{}", index + 1)),
            ("metadata".into(), format!("member={index}")),
            ("agent_ttl".into(), format!("{AGENT_TTL_SECONDS}s")),
            ("engine_reconcile_interval".into(), ENGINE_RECONCILE_SECONDS.to_string()),
            ("etcd_request_timeout".into(), "2".into()),
        ]
    }

    /// Starts member `index` with the shared lines and then `extra`.
    pub fn add_member(&mut self, index: usize, extra: &[(String, String)]) {
        let mut config = self.member_config(index);
        config.extend(extra.iter().cloned());
        let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.members.push(Fleetd::start(&member_id(index), &pairs));
    }

    /// A member that is running, to talk to the API through.
    pub fn any(&self) -> &Fleetd {
        self.members.iter().find(|member| member.is_running()).expect("a running member")
    }

    /// Every unit's machine and current state, from the API (`GET /fleet/v1/units`, all pages).
    pub fn placement(&self) -> Placement {
        self.any()
            .api_units()
            .iter()
            .map(|unit| {
                let name = unit["name"].as_str().unwrap_or_default().to_string();
                let machine = unit["machineID"].as_str().map(str::to_string);
                let state = unit["currentState"].as_str().unwrap_or_default().to_string();
                (name, (machine, state))
            })
            .collect()
    }

    /// How many units each machine holds.
    pub fn load(&self) -> BTreeMap<String, usize> {
        let mut load = BTreeMap::new();
        for (machine, _) in self.placement().values() {
            if let Some(machine) = machine {
                *load.entry(machine.clone()).or_insert(0) += 1;
            }
        }
        load
    }

    /// Polls `check` until it holds, or fails the test after `timeout` with every log.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !check(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The members' logs, for failure messages.
    pub fn logs(&self) -> String {
        self.members.iter().map(|member| format!("--- {} ---\n{}", member.machine_id, member.log())).collect()
    }

    /// The member whose engine leads, from the logs: the last to say it acquired leadership.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|member| {
            member.is_running() && {
                let log = member.log();
                let acquired = log.rfind("Engine leadership acquired");
                let lost = log.rfind("Engine leadership lost");
                acquired.is_some() && acquired > lost
            }
        })
    }
}
