//! The keeper: a small process, started by fleetd, that outlives it only long enough to kill
//! every unit process fleetd leaves behind when it dies without a clean shutdown (SIGKILL, a
//! crash). It learns of the death by end-of-file on a pipe whose write end only fleetd holds,
//! so no signal can be missed. It finds the units by their cgroups (which nothing a unit
//! does can leave) and by the supervisor marker in their environment.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::cgroup::CgroupBase;
use super::process::kill_leftovers;

/// The argument that turns the fleetd binary into a keeper.
pub const KEEPER_ARGUMENT: &str = "--native-unit-keeper";

/// Starts `program KEEPER_ARGUMENT marker` with a pipe on its standard input; fleetd keeps
/// the returned child (and so the pipe's write end) for its whole life.
pub fn spawn_keeper(program: &Path, marker: &str, cgroups: Option<&Path>) -> io::Result<Child> {
    let mut command = Command::new(program);
    command.arg(KEEPER_ARGUMENT).arg(marker);
    if let Some(dir) = cgroups {
        command.arg(dir);
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C meant for fleetd must not reach the keeper.
        .process_group(0)
        .spawn()
}

/// Where a keeper holds its lock: the state directory its marker names.
pub fn keeper_lock_path(marker: &str) -> std::path::PathBuf {
    Path::new(marker).join("native").join("keeper.lock")
}

/// The keeper's whole life: hold the keeper lock, wait for end-of-file, then kill what is
/// left: everything in the unit cgroups below `cgroups` (when fleetd had them), and every
/// process with the marker. A new fleetd waits for the lock, so it never starts units that
/// this keeper would then kill.
pub fn run_keeper(marker: &str, cgroups: Option<&Path>) -> usize {
    let _held = fleet_fs::lock_waiting(&keeper_lock_path(marker), Duration::from_secs(60)).ok().flatten();
    let mut buffer = [0u8; 64];
    let mut stdin = io::stdin();
    loop {
        match stdin.read(&mut buffer) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let in_cgroups = cgroups.map_or(0, |dir| CgroupBase::at(dir.to_path_buf()).kill_everything());
    in_cgroups + kill_leftovers(marker)
}
