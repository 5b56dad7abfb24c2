//! Where systemd keeps a service's processes: its `ControlGroup`, which a health check's
//! command joins so that it is one of the service's processes.

use zbus::Connection;
use zbus_systemd::systemd1::ServiceProxy;

/// The cgroup systemd keeps the service at `path` (its object path) in, as it names it
/// (empty while the service has none).
pub async fn control_group(connection: Connection, path: String) -> zbus::Result<String> {
    let no_cache = zbus::proxy::CacheProperties::No;
    let service = ServiceProxy::builder(&connection).path(path).cache_properties(no_cache).build().await?;
    service.control_group().await
}
