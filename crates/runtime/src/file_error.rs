//! The error of a file operation, with what was being done and to which path.

/// A file or folder that could not be created, opened, written or replaced: what was being
/// done, to which path, and the operating system's reason.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}", path.display())]
pub struct FileError {
    /// What was being done: `creating`, `opening`, `writing`, `replacing`.
    pub what: &'static str,
    /// The file or folder.
    pub path: std::path::PathBuf,
    /// The operating system's reason.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// The error of doing `what` to `path`, for `map_err`.
    pub fn of<'a>(
        what: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> FileError + 'a {
        move |source| FileError {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
