//! `fleetd -make-certificates DIR -hosts …`: the cluster's certificates in one step, and the
//! lines that use them (fleet.conf for a fleetd serving HTTPS and managing pull agents, the
//! flags of fleetctl, the lines of a pull agent).

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use fleet_tls::cluster_certificates::{self, ClusterCertificates};

/// What to write where, once the files are made.
pub fn usage_lines(files: &ClusterCertificates, host: &str) -> String {
    let path = |path: &Path| path.display().to_string();
    format!(
        "# fleet.conf of a fleetd serving the API over HTTPS (and a manager of pull agents):\n\
         api_listen = unix:///var/run/fleet.sock,https://0.0.0.0:4002\n\
         api_tls_cert_file = {server}\n\
         api_tls_key_file = {server_key}\n\
         api_tls_client_ca_file = {api_ca}\n\
         agent_ca_cert_file = {agent_ca}\n\
         agent_ca_key_file = {agent_ca_key}\n\
         secrets_key_file = {secrets_key}\n\
         \n\
         # fleetctl, as the administrator:\n\
         fleetctl --endpoint https://{host}:4002 --ca-file {api_ca} --cert-file {admin} --key-file {admin_key} list-machines\n\
         \n\
         # fleet.conf of a pull agent (copy {api_ca} to it; its token from `fleetctl registration-token create`):\n\
         manager_url = https://{host}:4002\n\
         manager_ca_file = {api_ca}\n\
         registration_token = …\n\
         \n\
         Keep {api_ca_key} and {agent_ca_key} off the machines that do not need them: with them anyone\n\
         can make certificates the cluster trusts. The server and admin certificates expire in a year.\n\
         {secrets_key} opens every secret of the cluster: copy it (0600) to every member of the store,\n\
         to no pull agent.\n",
        server = path(&files.server),
        server_key = path(&files.server_key),
        api_ca = path(&files.api_ca),
        api_ca_key = path(&files.api_ca_key),
        agent_ca = path(&files.agent_ca),
        agent_ca_key = path(&files.agent_ca_key),
        admin = path(&files.admin),
        admin_key = path(&files.admin_key),
        secrets_key = path(&files.secrets_key),
    )
}

pub fn run(dir: &Path, hosts: &[String]) -> ExitCode {
    // The lines printed name the files wherever they are read from.
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let dir = dir.as_path();
    match cluster_certificates::make(dir, hosts, SystemTime::now()) {
        Ok(files) => {
            let host = hosts.first().map_or("localhost", String::as_str);
            println!("made the cluster's certificates in {}\n", dir.display());
            print!("{}", usage_lines(&files, host));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("fleetd: {error}");
            ExitCode::FAILURE
        }
    }
}
