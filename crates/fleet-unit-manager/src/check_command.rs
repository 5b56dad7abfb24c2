//! A health check's command (`HealthCheck=exec:…`): run as the unit's user, in the unit's
//! cgroup where its manager has one and in a process group of its own, with a clean environment and no input, bounded by its timeout. Its output is
//! read as it comes and only the first bytes kept; when it exits or its time is up, everything
//! left in its group is killed, so a check that hangs, floods or forks leaves nothing behind.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::account::{lookup_group, lookup_user};
use crate::cgroup_procs::{CgroupProcs, become_account};

/// The output kept for the failure report.
const KEPT_OUTPUT: usize = 512;
/// The longest the output left in the pipes is read after the check ended.
const DRAIN_TIME: Duration = Duration::from_millis(200);
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Who a check runs as: the unit's `User=` and `Group=` (root when it names none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunAs {
    pub user: Option<String>,
    pub group: Option<String>,
}

/// Runs `argv` as `run_as` for at most `timeout`, as one of the unit's processes when `cgroup`
/// says where they are (it then counts against the unit's limits, and what it leaves goes with
/// the unit): `Ok` when it exits 0, else why not (its exit and the start of its output, or the
/// timeout).
pub async fn run_check(
    argv: &[String],
    run_as: &RunAs,
    cgroup: Option<CgroupProcs>,
    timeout: Duration,
) -> Result<(), String> {
    let Some(program) = argv.first() else { return Err("no command".to_string()) };
    let mut command = Command::new(program);
    command
        .args(&argv[1..])
        .env_clear()
        .env("PATH", PATH)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let (mut uid, mut gid) = (None, None);
    if let Some(user) = &run_as.user {
        let account = lookup_user(user).map_err(|error| error.to_string())?;
        (uid, gid) = (Some(account.uid), Some(account.gid));
        command.env("HOME", &account.home).env("USER", &account.name).env("LOGNAME", &account.name);
    }
    if let Some(group) = &run_as.group {
        gid = Some(lookup_group(group).map_err(|error| error.to_string())?);
    }
    // SAFETY: the closure makes only system calls (open, write, close, setgroups, setgid,
    // setuid) on memory prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            // Into the unit's cgroup while still root, then the unit's user.
            if let Some(cgroup) = &cgroup {
                cgroup.join_from_child()?;
            }
            become_account(uid, gid)
        });
    }
    let mut child = command.spawn().map_err(|error| format!("cannot run {program}: {error}"))?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut output = Vec::new();
    let ran = {
        // One reader of both pipes, from the start to their end, across both phases below.
        let reading = read_output(stdout, stderr, &mut output);
        tokio::pin!(reading);
        let mut read_all = false;
        let ran = tokio::time::timeout(timeout, async {
            loop {
                tokio::select! {
                    status = child.wait() => return status,
                    () = &mut reading, if !read_all => read_all = true,
                }
            }
        })
        .await;
        // Whatever it left in its group goes with it (a child it forked, a pipe holder).
        if let Some(group) = group {
            // SAFETY: killpg takes plain integers; a group that is gone answers ESRCH.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        // What it wrote just before it exited may still be in the pipes: their end comes at
        // once now that nothing of its group holds them (bounded all the same).
        if !read_all {
            let _ = tokio::time::timeout(DRAIN_TIME, &mut reading).await;
        }
        ran
    };
    let said = String::from_utf8_lossy(&output).trim().to_string();
    let with_output = |what: String| if said.is_empty() { what } else { format!("{what}: {said}") };
    match ran {
        Err(_) => {
            let _ = child.wait().await;
            Err(with_output(format!("timed out after {}s", timeout.as_secs_f64())))
        }
        Ok(Err(error)) => Err(format!("cannot wait for {program}: {error}")),
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(with_output(match status.code() {
            Some(code) => format!("exit status {code}"),
            None => "killed by a signal".to_string(),
        })),
    }
}

/// Reads both pipes to their end, keeping the first [`KEPT_OUTPUT`] bytes in `output`.
async fn read_output(
    mut stdout: Option<impl tokio::io::AsyncRead + Unpin>,
    mut stderr: Option<impl tokio::io::AsyncRead + Unpin>,
    output: &mut Vec<u8>,
) {
    let (mut chunk, mut other) = ([0u8; 4096], [0u8; 4096]);
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            read = read_some(&mut stdout, &mut chunk) => keep(output, &chunk, read, &mut stdout),
            read = read_some(&mut stderr, &mut other) => keep(output, &other, read, &mut stderr),
        }
    }
}

/// Reads from `pipe` while it is open; never returns once it is closed.
async fn read_some(pipe: &mut Option<impl tokio::io::AsyncRead + Unpin>, buffer: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(buffer).await,
        None => std::future::pending().await,
    }
}

/// Keeps the start of what was read; closes the pipe at its end.
fn keep<P>(output: &mut Vec<u8>, chunk: &[u8], read: std::io::Result<usize>, pipe: &mut Option<P>) {
    match read {
        Ok(0) | Err(_) => *pipe = None,
        Ok(count) => {
            let room = KEPT_OUTPUT.saturating_sub(output.len());
            output.extend_from_slice(&chunk[..count.min(room)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    async fn check(script: &str, timeout_ms: u64) -> Result<(), String> {
        run_check(&sh(script), &RunAs::default(), None, Duration::from_millis(timeout_ms)).await
    }

    #[tokio::test]
    async fn exit_zero_passes_and_anything_else_says_why() {
        assert_eq!(check("exit 0", 5000).await, Ok(()));
        assert_eq!(check("echo not ready >&2; exit 3", 5000).await, Err("exit status 3: not ready".into()));
        let missing = run_check(&["/no/such/check".into()], &RunAs::default(), None, Duration::from_secs(5)).await;
        assert!(missing.is_err_and(|why| why.starts_with("cannot run /no/such/check")));
    }

    #[tokio::test]
    async fn a_flood_is_cut_and_a_hang_ends_at_the_timeout() {
        let flood = check("yes flood | head -c 10000000; exit 1", 20_000).await.expect_err("exit 1");
        assert!(flood.len() < KEPT_OUTPUT + 50, "{} bytes kept", flood.len());
        let hang = check("sleep 1000", 200).await.expect_err("hangs");
        assert!(hang.starts_with("timed out after 0.2s"), "{hang}");
    }

    /// A check that leaves a child behind (holding its output open, even) is over when it
    /// exits, and the child is killed with it.
    #[tokio::test]
    async fn nothing_it_forked_outlives_it() {
        let marker = format!("{}.{}", 900_000 + std::process::id() % 10_000, std::process::id());
        let script = format!("sleep {marker} & echo started; exit 0");
        let started = std::time::Instant::now();
        assert_eq!(check(&script, 20_000).await, Ok(()));
        assert!(started.elapsed() < Duration::from_secs(15), "it waited for the child's pipe");
        let left = sleeping_for(&marker);
        assert!(left.is_empty(), "left running: {left:?}");
        let hung = format!("sleep {marker} & sleep 1000");
        assert!(check(&hung, 300).await.is_err());
        assert!(sleeping_for(&marker).is_empty());
    }

    /// The processes running `sleep marker` (read from /proc; a process killed but not yet
    /// reaped shows no command line).
    fn sleeping_for(marker: &str) -> Vec<u32> {
        let wanted = format!("sleep\0{marker}\0");
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| line.ends_with(wanted.as_bytes()))
            })
            .collect()
    }
}
