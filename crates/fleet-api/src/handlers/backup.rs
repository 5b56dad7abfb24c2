//! `GET /fleet/v1/backup` (ours, administrators only): a consistent snapshot of the embedded
//! store while fleetd serves, sent as the file `fleetd -restore` takes. It is written into a
//! private file beside the store (0600, gone once sent), one backup at a time. On etcd the
//! answer says to use etcd's own snapshots.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleet_registry::StoreBackup;

use crate::api_state::ApiState;
use crate::error::ApiError;

/// How the store is backed up: the store, and the private directory snapshots are written in.
#[derive(Clone)]
pub struct Backup {
    pub store: Arc<dyn StoreBackup>,
    pub scratch: PathBuf,
    /// Held while a backup is written and sent.
    pub under_way: Arc<tokio::sync::Mutex<()>>,
}

/// How much of the snapshot is read at a time as it is sent.
const CHUNK: usize = 64 * 1024;

pub async fn get(state: &ApiState) -> Result<Response, ApiError> {
    let Some(backup) = &state.backup else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "this fleetd keeps its store in etcd: back it up with etcdctl snapshot save (README: Backing up)",
        ));
    };
    let Ok(turn) = backup.under_way.clone().try_lock_owned() else {
        return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "a backup is under way; try again once it is done"));
    };
    let unavailable = |error: std::io::Error| {
        tracing::error!(%error, "cannot write a backup");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "cannot write the backup: fleetd's log says why")
    };
    let file = tempfile::Builder::new()
        .prefix(".backup-")
        .suffix(".redb")
        .tempfile_in(&backup.scratch)
        .map_err(unavailable)?;
    // Said as what it is: the generic store error would read "unable to communicate with etcd".
    let size = backup.store.back_up(file.path()).await.map_err(|error| {
        tracing::error!(%error, "cannot take a backup");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "cannot take the backup: fleetd's log says why")
    })?;
    let reader = tokio::fs::File::open(file.path()).await.map_err(unavailable)?;
    // The file and the turn go with the answer: deleted and released once it is sent.
    let chunks = futures_util::stream::unfold((reader, file, turn), |(mut reader, file, turn)| async move {
        use tokio::io::AsyncReadExt;
        let mut buffer = vec![0; CHUNK];
        match reader.read(&mut buffer).await {
            Ok(0) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((Ok::<_, std::io::Error>(buffer), (reader, file, turn)))
            }
            Err(error) => Some((Err(error), (reader, file, turn))),
        }
    });
    tracing::info!(bytes = size, "backup taken");
    let length = size.to_string();
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream"), (header::CONTENT_LENGTH, length.as_str())],
        Body::from_stream(chunks),
    )
        .into_response())
}
