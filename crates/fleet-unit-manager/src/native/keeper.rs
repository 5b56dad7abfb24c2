//! The keeper: a small process, started by fleetd, that outlives it only long enough to kill
//! every unit process fleetd leaves behind when it dies without a clean shutdown (SIGKILL, a
//! crash). It learns of the death by end-of-file on a pipe whose write end only fleetd holds,
//! so no signal can be missed. It finds the units by the supervisor marker in their
//! environment, which catches children and daemons that left their process group.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::process::kill_leftovers;

/// The argument that turns the fleetd binary into a keeper.
pub const KEEPER_ARGUMENT: &str = "--native-unit-keeper";

/// Starts `program KEEPER_ARGUMENT marker` with a pipe on its standard input; fleetd keeps
/// the returned child (and so the pipe's write end) for its whole life.
pub fn spawn_keeper(program: &Path, marker: &str) -> io::Result<Child> {
    Command::new(program)
        .arg(KEEPER_ARGUMENT)
        .arg(marker)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C meant for fleetd must not reach the keeper.
        .process_group(0)
        .spawn()
}

/// The keeper's whole life: wait for end-of-file, then kill what is left.
pub fn run_keeper(marker: &str) -> usize {
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
    kill_leftovers(marker)
}
