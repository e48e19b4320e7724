//! `--output`: the file is opened once, when `zerotx recv` starts, never through a symbolic
//! link (`O_NOFOLLOW`) and only if it is a regular file; each transfer empties that same open
//! file and writes from its start. A path swapped for a link (or anything else) after the start
//! changes nothing: the receiver never opens the path again.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The open `--output` file.
#[derive(Debug)]
pub(super) struct Output {
    file: File,
    path: PathBuf,
}

impl Output {
    /// Opens `path` for writing, creating it (mode 0644 less the umask) when it is missing,
    /// leaving its contents alone until a transfer starts.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    anyhow::anyhow!(
                        "--output {} is a symbolic link: give the file itself (zerotx recv \
                         never writes through a link)",
                        path.display()
                    )
                } else {
                    anyhow::Error::new(e).context(format!(
                        "cannot write --output {}: give a file in a directory that exists and \
                         is writable",
                        path.display()
                    ))
                }
            })?;
        let meta = file
            .metadata()
            .with_context(|| format!("cannot stat --output {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "--output {} is not a regular file: give a file to write what arrives into",
                path.display()
            );
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The file emptied for a transfer that starts, as a handle positioned at its start (it
    /// shares the one open file).
    pub fn start(&self) -> io::Result<File> {
        let f = self.file.try_clone()?;
        f.set_len(0)?;
        (&f).seek(SeekFrom::Start(0))?;
        Ok(f)
    }

    /// The path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
