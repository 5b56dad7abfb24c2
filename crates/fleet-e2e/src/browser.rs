//! A real headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a
//! pipe (`--remote-debugging-pipe`: JSON messages ended by NUL on file descriptors 3 and 4),
//! for the web view's tests: open a page, evaluate JavaScript in it, take a screenshot.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

const ANSWER_WITHIN: Duration = Duration::from_secs(30);

pub struct Browser {
    chromium: Child,
    commands: File,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(made, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made and belong to nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts Chromium and opens `url` in a page of `width`×`height`.
    pub fn open(url: &str, width: u32, height: u32) -> Self {
        let profile = tempfile::tempdir().expect("profile dir");
        let (to_browser_read, to_browser_write) = pipe();
        let (from_browser_read, from_browser_write) = pipe();
        let (read_fd, write_fd) = (to_browser_read.as_raw_fd(), from_browser_write.as_raw_fd());
        let mut command = Command::new("chromium");
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: fcntl, dup2 and prctl are async-signal-safe. The pipe ends are first copied
        // above 10, so that neither is overwritten when the other lands on 3 or 4; the copies
        // made by dup2 (the descriptors 3 and 4 Chromium reads) do not close on exec.
        unsafe {
            command.pre_exec(move || {
                let read = libc::fcntl(read_fd, libc::F_DUPFD, 10);
                let write = libc::fcntl(write_fd, libc::F_DUPFD, 10);
                if read < 0 || write < 0 || libc::dup2(read, 3) < 0 || libc::dup2(write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let chromium = command.spawn().expect("start chromium (Debian's chromium package)");
        drop((to_browser_read, from_browser_write));
        let (sender, messages) = channel();
        let mut reader = BufReader::new(File::from(from_browser_read));
        std::thread::spawn(move || {
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|read| read > 0) {
                message.pop();
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && sender.send(value).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        let mut browser = Self {
            chromium,
            commands: File::from(to_browser_write),
            messages,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": url }), false);
        let target = target["targetId"].as_str().expect("a target ID").to_string();
        let attached = browser.call("Target.attachToTarget", json!({ "targetId": target, "flatten": true }), false);
        browser.session = attached["sessionId"].as_str().expect("a session ID").to_string();
        browser
    }

    /// Sends one command (to the page when `in_page`) and waits for its answer.
    fn call(&mut self, method: &str, params: Value, in_page: bool) -> Value {
        match self.try_call(method, params, in_page) {
            Ok(result) => result,
            Err(answer) => panic!("{method}: {answer}"),
        }
    }

    /// [`Browser::call`], with the browser's error answer as `Err`.
    fn try_call(&mut self, method: &str, params: Value, in_page: bool) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if in_page {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("encode a command");
        bytes.push(0);
        self.commands.write_all(&bytes).expect("send a command to chromium");
        loop {
            let answer = self.messages.recv_timeout(ANSWER_WITHIN).expect("chromium answers");
            if answer["id"] == json!(id) {
                return match answer.get("error") {
                    None => Ok(answer["result"].clone()),
                    Some(_) => Err(answer),
                };
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }), true);
        result["result"]["value"].clone()
    }

    /// Waits until the page opened has loaded (its first document may still be replaced
    /// while [`Browser::open`] returns).
    pub fn wait_until_loaded(&mut self, url: &str) {
        let expression = json!({ "expression": "document.readyState + ' ' + location.href", "returnByValue": true });
        crate::poll_until(
            "the page has loaded",
            ANSWER_WITHIN,
            || {
                self.try_call("Runtime.evaluate", expression.clone(), true).is_ok_and(|result| {
                    result["result"]["value"].as_str().is_some_and(|state| state == format!("complete {url}"))
                })
            },
            String::new,
        );
    }

    /// The value a JavaScript expression's promise settles to.
    pub fn evaluate_async(&mut self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let result = self.call("Runtime.evaluate", params, true);
        result["result"]["value"].clone()
    }

    /// The page as a PNG file.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" }), true);
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("artifact dir");
        }
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.chromium.kill();
        let _ = self.chromium.wait();
    }
}
