//! The one thread that starts every unit process. Forking a large fleetd takes time in
//! proportion to its memory; done on the runtime's workers, a thousand starts at once kept
//! the API from answering. Done here, they wait on each other instead. The thread lives as
//! long as the manager: a process's parent-death signal fires when the *thread* that forked
//! it ends, so it must not be a pool thread that retires when idle.

use std::io;
use std::sync::mpsc;

use tokio::process::Child;
use tokio::sync::oneshot;

use super::command::ExecCommand;
use super::process::{ExecContext, spawn};
use super::unit_log::LogSink;

struct Request {
    command: ExecCommand,
    context: ExecContext,
    log: LogSink,
    reply: oneshot::Sender<io::Result<Child>>,
}

pub struct Spawner {
    requests: mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the spawning thread, in the current runtime (which the children's handles and
    /// output copiers belong to).
    pub fn start() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new().name("fleet-unit-spawner".into()).spawn(move || {
            let _runtime = runtime.enter();
            for request in incoming {
                let _ = request.reply.send(spawn(&request.command, &request.context, &request.log));
            }
        })?;
        Ok(Self { requests })
    }

    /// Starts `command` (see [`spawn`]) on the spawning thread.
    pub async fn spawn(&self, command: &ExecCommand, context: &ExecContext, log: &LogSink) -> io::Result<Child> {
        let (reply, answer) = oneshot::channel();
        let request = Request { command: command.clone(), context: context.clone(), log: log.clone(), reply };
        self.requests.send(request).map_err(|_| io::Error::other("the unit spawner has stopped"))?;
        answer.await.map_err(|_| io::Error::other("the unit spawner has stopped"))?
    }
}
