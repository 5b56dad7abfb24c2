//! `fleetd -rotate-secrets-key FILE [-drop-old-keys]`: the cluster's secrets key rotated in
//! its file, which the operator then copies to every member (see the manual's steps).

use std::path::Path;
use std::process::ExitCode;

use fleet_secrets::ClusterKeys;

pub fn run(file: &Path, drop_old: bool) -> ExitCode {
    let keys = match ClusterKeys::load(file) {
        Ok(keys) => keys,
        Err(error) => {
            eprintln!("fleetd: {error}");
            return ExitCode::FAILURE;
        }
    };
    let rotated = if drop_old { Ok(keys.sealing_only()) } else { keys.with_new_sealing_key() };
    let written = rotated.and_then(|rotated| rotated.replace(file).map(|()| rotated));
    match written {
        Ok(rotated) => {
            let ids = rotated.ids();
            println!("{} now seals with key {}; it holds {}", file.display(), ids[0], ids.join(", "));
            if drop_old {
                println!("copy it to every member and send them SIGHUP");
            } else {
                println!(
                    "copy it to every member, send them SIGHUP, run `fleetctl secret reseal`, then \
                     `fleetd -rotate-secrets-key {} -drop-old-keys` and copy it again",
                    file.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fleetd: {error}");
            ExitCode::FAILURE
        }
    }
}
