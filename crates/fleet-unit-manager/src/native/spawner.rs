//! The one thread that starts every unit process. Forking a large fleetd takes time in
//! proportion to its memory; done on the runtime's workers, a thousand starts at once kept
//! the API from answering. Done here, they wait on each other instead. The thread lives as
//! long as the manager: a process's parent-death signal fires when the *thread* that forked
//! it ends, so it must not be a pool thread that retires when idle. For the same reason it is
//! the thread that replaces fleetd in place for an upgrade: the thread that calls `execve`
//! lives on as the new image, so the units it forked keep running.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use fleet_core::unpoisoned::Locked;

use tokio::sync::oneshot;

use super::command::ExecCommand;
use super::process::{ExecContext, Started, spawn};
use super::unit_log::LogSink;

struct SpawnRequest {
    command: ExecCommand,
    context: ExecContext,
    log: LogSink,
    reply: oneshot::Sender<io::Result<Started>>,
}

enum Request {
    Spawn(Box<SpawnRequest>),
    /// Keeps the thread until the sender is dropped (tests: a start that waits its turn).
    #[cfg(test)]
    Hold(mpsc::Receiver<()>),
    Exec {
        image: crate::reexec::ExecImage,
        keep: Vec<RawFd>,
        reply: oneshot::Sender<io::Error>,
    },
}

pub struct Spawner {
    requests: mpsc::Sender<Request>,
    /// What the thread is starting now (unit, program) and since when: told when a start
    /// waits long on it.
    busy: Arc<Mutex<Option<Busy>>>,
}

#[derive(Clone, Debug)]
struct Busy {
    unit: String,
    program: String,
    since: Instant,
}

/// How long a start waits on the spawning thread before fleetd's log says so (again at twice,
/// four times as long…). A fork and exec take milliseconds; a start that never comes would
/// otherwise leave its unit activating with no word of why.
const SLOW_SPAWN: Duration = Duration::from_secs(10);

impl Spawner {
    /// Starts the spawning thread, in the current runtime (which the children's handles and
    /// output copiers belong to).
    pub fn start() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (requests, incoming) = mpsc::channel::<Request>();
        let busy = Arc::new(Mutex::new(None));
        let noted = busy.clone();
        std::thread::Builder::new().name("fleet-unit-spawner".into()).spawn(move || {
            let _runtime = runtime.enter();
            for request in incoming {
                match request {
                    // Its runner gave it up while it waited (a stop came): nothing to start.
                    Request::Spawn(request) if request.reply.is_closed() => {}
                    Request::Spawn(request) => {
                        *noted.locked() = Some(Busy {
                            unit: request.context.unit.clone(),
                            program: request.command.argv[0].clone(),
                            since: Instant::now(),
                        });
                        let started = spawn(&request.command, &request.context, &request.log);
                        *noted.locked() = None;
                        let _ = request.reply.send(started);
                    }
                    #[cfg(test)]
                    Request::Hold(release) => {
                        let _ = release.recv();
                    }
                    Request::Exec { image, keep, reply } => {
                        let _ = reply.send(exec_keeping(&image, &keep));
                    }
                }
            }
        })?;
        Ok(Self { requests, busy })
    }

    /// Starts `command` (see [`spawn`]) on the spawning thread.
    pub async fn spawn(&self, command: &ExecCommand, context: &ExecContext, log: &LogSink) -> io::Result<Started> {
        let (reply, answer) = oneshot::channel();
        let request = Request::Spawn(Box::new(SpawnRequest {
            command: command.clone(),
            context: context.clone(),
            log: log.clone(),
            reply,
        }));
        self.requests.send(request).map_err(|_| io::Error::other("the unit spawner has stopped"))?;
        let answered = fleet_runtime::slow::telling_when_late(SLOW_SPAWN, answer, |waited| {
            let busy = self.busy.locked().clone();
            tracing::warn!(
                unit = context.unit,
                program = command.argv[0],
                ?waited,
                spawner_on = busy.as_ref().map(|busy| format!("{} of {}", busy.program, busy.unit)),
                spawner_for = ?busy.map(|busy| busy.since.elapsed()),
                "a unit's process waits to be started: the spawning thread has not come to it"
            );
        })
        .await;
        answered.map_err(|_| io::Error::other("the unit spawner has stopped"))?
    }

    /// Keeps the spawning thread busy until the returned sender is dropped.
    #[cfg(test)]
    pub fn hold(&self) -> mpsc::Sender<()> {
        let (release, released) = mpsc::channel();
        let _ = self.requests.send(Request::Hold(released));
        release
    }

    /// Replaces this process with `image` from the spawning thread, `keep` passed through;
    /// returns only if that failed, with why.
    pub async fn exec(&self, image: crate::reexec::ExecImage, keep: Vec<RawFd>) -> io::Error {
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Request::Exec { image, keep, reply }).is_err() {
            return io::Error::other("the unit spawner has stopped");
        }
        answer.await.unwrap_or_else(|_| io::Error::other("the unit spawner has stopped"))
    }
}

/// Marks `keep` to pass through `execve`, then calls it.
fn exec_keeping(image: &crate::reexec::ExecImage, keep: &[RawFd]) -> io::Error {
    for fd in keep {
        if let Err(error) = super::handover::keep_across_exec(*fd) {
            return error;
        }
    }
    image.exec()
}
