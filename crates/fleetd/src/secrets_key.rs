//! Which secrets key this fleetd uses (see `secrets_key_file` in the configuration).

use std::path::{Path, PathBuf};

use fleet_api::secret_keys::SecretKeys;
use fleet_secrets::KEY_FILE_NAME;

use fleetd::config::Config;

/// The key `config` names: `secrets_key_file`; else `secrets.key` beside the agent CA key;
/// else, on the embedded store, the state directory's own (made when first needed).
pub fn of(config: &Config) -> SecretKeys {
    if !config.secrets_key_file.is_empty() {
        return SecretKeys::at(PathBuf::from(&config.secrets_key_file));
    }
    if !config.agent_ca_key_file.is_empty() {
        let dir = Path::new(&config.agent_ca_key_file).parent().unwrap_or(Path::new("."));
        return SecretKeys::at(dir.join(KEY_FILE_NAME));
    }
    if config.etcd_servers.is_empty() {
        return SecretKeys::own_at(config.state_dir.join(KEY_FILE_NAME));
    }
    SecretKeys::missing(
        "no secrets key: set secrets_key_file to the cluster's (fleetd -make-certificates makes one; copy it to every member, 0600)",
    )
}
