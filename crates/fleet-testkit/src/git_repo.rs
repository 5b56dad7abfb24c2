//! A git repository made for a test or a benchmark, committed to with the git command line.

use std::process::Command;

pub struct GitRepo {
    dir: tempfile::TempDir,
}

impl Default for GitRepo {
    fn default() -> Self {
        Self::new()
    }
}

impl GitRepo {
    /// An empty repository whose branch is `main`.
    pub fn new() -> Self {
        let repo = Self { dir: tempfile::tempdir().expect("a repository dir") };
        repo.git(&["init", "--quiet", "--initial-branch=main"]);
        repo
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }

    /// Runs git in the repository; its output, trimmed.
    pub fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .args(["-c", "user.name=fleet test", "-c", "user.email=test@fleet.invalid", "-c", "commit.gpgsign=false"])
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run git");
        assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Writes (or, with `None`, removes) files and commits them; the new commit.
    pub fn commit(&self, files: &[(&str, Option<&str>)], message: &str) -> String {
        for (path, text) in files {
            let path = self.dir.path().join(path);
            match text {
                Some(text) => {
                    std::fs::create_dir_all(path.parent().expect("a parent")).expect("make dirs");
                    std::fs::write(&path, text).expect("write a file");
                }
                None => std::fs::remove_file(&path).expect("remove a file"),
            }
        }
        self.git(&["add", "--all"]);
        self.git(&["commit", "--quiet", "--allow-empty", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }
}
