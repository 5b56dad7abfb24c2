//! fleetctl(1) and a page per command, written by clap_mangen from the definitions behind
//! `--help`.

use std::path::Path;

use crate::Outcome;

fn render(command: clap::Command) -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command).render(&mut page)?;
    Ok(page)
}

/// Prints fleetctl.1, or writes it and `fleetctl-COMMAND.1` for every visible command into `dir`.
pub fn write(command: clap::Command, dir: Option<&Path>) -> Outcome {
    let command = command.version(env!("CARGO_PKG_VERSION"));
    let result = match dir {
        // A closed stdout (`| head`) is the reader's choice, not an error.
        None => render(command).map(|page| {
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &page);
        }),
        Some(dir) => write_pages(command, dir),
    };
    match result {
        Ok(()) => Outcome::Success,
        Err(error) => {
            eprintln!("Error writing the manual: {error}");
            Outcome::Failure
        }
    }
}

fn write_pages(command: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut command = command;
    command.build();
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set() && sub.get_name() != "help") {
        let name = format!("fleetctl-{}", sub.get_name());
        let page = render(sub.clone().name(name.clone()).version(env!("CARGO_PKG_VERSION")))?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
    }
    std::fs::write(dir.join("fleetctl.1"), render(command)?)
}
