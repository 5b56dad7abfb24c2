//! The cluster's secrets keys and their file: comment lines, then one
//! `fleet-secrets-key <base64 of 32 bytes>` line per key. The first key seals; the others
//! only open what they sealed (kept while the cluster rotates to a new key). The file is
//! created 0600, never through a link, and refused when anyone but its owner may read it.

use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The key file's name, beside the agent CA key or in a single machine's state directory.
pub const KEY_FILE_NAME: &str = "secrets.key";

const LINE: &str = "fleet-secrets-key";
const KEY_BYTES: usize = 32;
const HEADER: &str = "# fleet's secrets key: whoever reads this file can read every secret of the cluster.\n\
                      # The first key seals; the others only open what they sealed (kept while rotating).\n";

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("reading the secrets key {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("writing the secrets key {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("the secrets key {path} may be read by others than its owner (mode {mode:o}): make it 0600")]
    Exposed { path: String, mode: u32 },
    #[error("the secrets key {path}: line {line} is not `fleet-secrets-key <base64 of 32 bytes>`")]
    Malformed { path: String, line: usize },
    #[error("the secrets key {path} holds no key")]
    Empty { path: String },
    #[error("the system's random number generator failed")]
    Random,
}

/// One key: its bytes and the short id sealed values name it by.
pub struct ClusterKey {
    bytes: [u8; KEY_BYTES],
    id: String,
}

impl ClusterKey {
    fn new(bytes: [u8; KEY_BYTES]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
        let id = digest.as_ref()[..8].iter().map(|byte| format!("{byte:02x}")).collect();
        Self { bytes, id }
    }

    /// The key's id: the first 8 bytes of its SHA-256, in hex (nothing of the key itself).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn aead_key(&self) -> UnboundKey {
        // A 32-byte key is what AES-256-GCM takes: this cannot fail.
        UnboundKey::new(&AES_256_GCM, &self.bytes).unwrap_or_else(|_| unreachable!("a 32-byte AES-256 key"))
    }
}

impl Drop for ClusterKey {
    fn drop(&mut self) {
        crate::wipe::wipe(&mut self.bytes);
    }
}

/// The cluster's keys: the first seals, every one opens.
pub struct ClusterKeys {
    keys: Vec<ClusterKey>,
}

impl std::fmt::Debug for ClusterKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(ClusterKey::id).collect();
        write!(f, "ClusterKeys({ids:?})")
    }
}

fn random_key() -> Result<ClusterKey, KeyFileError> {
    let mut bytes = [0u8; KEY_BYTES];
    SystemRandom::new().fill(&mut bytes).map_err(|_| KeyFileError::Random)?;
    Ok(ClusterKey::new(bytes))
}

impl ClusterKeys {
    /// One new random key.
    pub fn generate() -> Result<Self, KeyFileError> {
        Ok(Self { keys: vec![random_key()?] })
    }

    /// These keys with a new random one in front: it seals from now on, and the others still
    /// open what they sealed.
    pub fn with_new_sealing_key(&self) -> Result<Self, KeyFileError> {
        let mut keys = vec![random_key()?];
        keys.extend(self.keys.iter().map(|key| ClusterKey::new(key.bytes)));
        Ok(Self { keys })
    }

    /// Only the sealing key: once every value is sealed under it, the others can go.
    pub fn sealing_only(&self) -> Self {
        Self { keys: vec![ClusterKey::new(self.sealing().bytes)] }
    }

    pub fn sealing(&self) -> &ClusterKey {
        &self.keys[0]
    }

    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(ClusterKey::id).collect()
    }

    pub(crate) fn by_id(&self, id: &str) -> Option<&ClusterKey> {
        self.keys.iter().find(|key| key.id == id)
    }

    /// The file's text.
    pub fn text(&self) -> String {
        let mut text = HEADER.to_string();
        for key in &self.keys {
            text.push_str(&format!("{LINE} {}\n", STANDARD.encode(key.bytes)));
        }
        text
    }

    /// Reads the keys in `text` (from the file `path`, for errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, KeyFileError> {
        let shown = || path.display().to_string();
        let mut keys = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let malformed = || KeyFileError::Malformed { path: shown(), line: index + 1 };
            let encoded = line.strip_prefix(LINE).and_then(|rest| rest.strip_prefix(' ')).ok_or_else(malformed)?;
            let bytes = STANDARD.decode(encoded.trim()).map_err(|_| malformed())?;
            let bytes: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| malformed())?;
            keys.push(ClusterKey::new(bytes));
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty { path: shown() });
        }
        Ok(Self { keys })
    }

    /// Reads the key file at `path`, refusing one that others than its owner may read.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        let read = |source| KeyFileError::Read { path: path.display().to_string(), source };
        let file = fleet_fs::open_no_follow(path).map_err(read)?;
        let mode = file.metadata().map_err(read)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Exposed { path: path.display().to_string(), mode: mode & 0o7777 });
        }
        let text = io::read_to_string(file).map_err(read)?;
        Self::parse(&text, path)
    }

    /// Writes these keys to `path`, which must not exist yet (`AlreadyExists` if it does):
    /// created 0600 beside it and linked into place, so no reader ever sees half a file and
    /// two fleetds making one at once keep the first.
    pub fn create(&self, path: &Path) -> Result<(), KeyFileError> {
        let write = |source| KeyFileError::Write { path: path.display().to_string(), source };
        let staged = path.with_extension(format!("new.{}", std::process::id()));
        let _ = std::fs::remove_file(&staged);
        let result = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                // create_new: never through a link, never over a file.
                .mode(0o600)
                .open(&staged)?;
            file.write_all(self.text().as_bytes())?;
            file.sync_all()?;
            std::fs::hard_link(&staged, path)
        })();
        let _ = std::fs::remove_file(&staged);
        result.map_err(write)
    }

    /// Replaces the key file at `path` with these keys (a rotation), 0600.
    pub fn replace(&self, path: &Path) -> Result<(), KeyFileError> {
        fleet_fs::write_private(path, self.text().as_bytes())
            .map_err(|source| KeyFileError::Write { path: path.display().to_string(), source })
    }

    /// The keys in `path`, made there first if there is no file (a single machine's own).
    pub fn load_or_create(path: &Path) -> Result<Self, KeyFileError> {
        match Self::load(path) {
            Err(KeyFileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                let keys = Self::generate()?;
                match keys.create(path) {
                    Ok(()) => Ok(keys),
                    Err(KeyFileError::Write { source, .. }) if source.kind() == io::ErrorKind::AlreadyExists => {
                        Self::load(path)
                    }
                    Err(error) => Err(error),
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE_NAME);
        let made = ClusterKeys::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = ClusterKeys::load_or_create(&path).unwrap();
        assert_eq!(made.ids(), again.ids(), "the same key, not a second one");
        assert!(!format!("{made:?}").contains(&STANDARD.encode(made.sealing().bytes)), "Debug shows ids only");
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE_NAME);
        ClusterKeys::generate().unwrap().create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = ClusterKeys::load(&path).unwrap_err();
        assert!(error.to_string().contains("make it 0600"), "{error}");
    }

    #[test]
    fn a_broken_key_file_names_its_line() {
        let path = Path::new("/etc/fleet/secrets.key");
        let error = ClusterKeys::parse("# comment\nfleet-secrets-key AAAA\n", path).unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
        assert!(matches!(ClusterKeys::parse("# only a comment\n", path), Err(KeyFileError::Empty { .. })));
    }

    #[test]
    fn a_rotation_seals_with_the_new_key_and_opens_with_both() {
        let old = ClusterKeys::generate().unwrap();
        let sealed = crate::seal(&old, "s", 1, b"v").unwrap();
        let rotated = old.with_new_sealing_key().unwrap();
        assert_ne!(rotated.sealing().id(), old.sealing().id());
        assert_eq!(crate::open(&rotated, "s", 1, &sealed).unwrap().expose(), b"v");
        let text = rotated.text();
        let read = ClusterKeys::parse(&text, Path::new("k")).unwrap();
        assert_eq!(read.ids(), rotated.ids());
        assert!(crate::open(&rotated.sealing_only(), "s", 1, &sealed).is_err(), "the old key dropped");
    }
}
