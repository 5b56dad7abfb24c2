//! `fleetctl backup FILE`: a snapshot of the embedded store, taken while fleetd runs, into a
//! private file. It goes to `FILE.partial` first and becomes FILE only once whole, so an
//! interrupted backup never leaves a FILE that looks like one.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::Outcome;
use crate::context::Context;

pub async fn run(context: &Context, file: &Path) -> Outcome {
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let _ = std::fs::remove_file(&partial);
    let mut out = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&partial) {
        Ok(out) => out,
        Err(error) => {
            eprintln!("Error writing the backup: {}: {error}", partial.display());
            return Outcome::Failure;
        }
    };
    let taken = context.client.backup(&mut out).await;
    let kept = taken.and_then(|bytes| {
        out.flush()
            .and_then(|()| out.sync_all())
            .and_then(|()| std::fs::rename(&partial, file))
            .map(|()| bytes)
            .map_err(|error| fleet_client::ClientError::Transport(format!("{}: {error}", file.display())))
    });
    match kept {
        Ok(bytes) => {
            println!("Backup of {bytes} bytes written to {}; restore it with fleetd -restore", file.display());
            Outcome::Success
        }
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            eprintln!("Error taking a backup: {error}");
            Outcome::Failure
        }
    }
}
