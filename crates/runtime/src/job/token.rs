//! The token `syncopate launch` runs a job under: the one given, the one kept beside the
//! job's checkpoints, or a fresh one, kept there (`job.token`, mode 0600) so that a resumed
//! job runs under the token it was started with.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::auth::{AuthError, JobToken, TOKEN_ENV};
use crate::checkpoint::JobFolders;
use crate::file_error::FileError;

/// The name of the file in a checkpoint folder where `launch` keeps a token it generated.
pub const TOKEN_NAME: &str = "job.token";

/// Why the job's token could not be found, made or kept.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The folder to resume from does not exist.
    #[error("--resume {}: no such folder", .0.display())]
    NoResumeFolder(PathBuf),
    /// A resumed job was given a token file that does not exist.
    #[error(
        "--token-file {}: no such file, and a resumed job needs the token it was started with",
        .0.display()
    )]
    NoTokenFileOnResume(PathBuf),
    /// The folder resumed from keeps no token, and none was given.
    #[error("{} has no {TOKEN_NAME}: resume with the job's --token or --token-file", .0.display())]
    NoKeptToken(PathBuf),
    /// The given or kept token is malformed or unreadable.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A file or folder could not be created, opened, written or replaced.
    #[error(transparent)]
    Io(#[from] FileError),
}

/// Where `launch` looks for the job's token: the flags that give one, and the job's
/// checkpoint folders.
#[derive(Debug, Clone, Copy)]
pub struct TokenSources<'a> {
    /// `--token`.
    pub token: Option<&'a str>,
    /// `--token-file`.
    pub token_file: Option<&'a Path>,
    /// `--checkpoint-dir` and `--resume`.
    pub folders: JobFolders<'a>,
}

impl TokenSources<'_> {
    /// The job's token for `launch`: the given one (a --token-file that does not exist yet
    /// receives a fresh one, kept there rather than beside the checkpoints), else the one
    /// kept in the folder resumed from (copied into another --checkpoint-dir, so that a
    /// later resume from there finds it), else the one kept in --checkpoint-dir, made and
    /// kept there on the first run; `None`: a fresh one.
    pub fn launch_token(&self) -> Result<Option<JobToken>, TokenError> {
        let resume = self.folders.resume;
        if let Some(dir) = resume.filter(|d| !d.is_dir()) {
            return Err(TokenError::NoResumeFolder(dir.to_path_buf()));
        }
        let token_env = std::env::var(TOKEN_ENV).is_ok_and(|t| !t.trim().is_empty());
        let new_file = self.token_file.filter(|p| !p.exists());
        if let (Some(path), None, false) = (new_file, self.token, token_env) {
            if resume.is_some() {
                return Err(TokenError::NoTokenFileOnResume(path.to_path_buf()));
            }
            let token = JobToken::generate();
            write_secret(path, &token.to_hex())?;
            return Ok(Some(token));
        }
        if let Some(token) = self.given_token()? {
            return Ok(Some(token));
        }
        if let Some(from) = resume {
            let path = from.join(TOKEN_NAME);
            if !path.exists() {
                return Err(TokenError::NoKeptToken(from.to_path_buf()));
            }
            let token = JobToken::resolve(None, Some(&path))?;
            let to = self.folders.checkpoint_dir;
            if let (Some(to), true) = (to, self.folders.writes_into_another_folder()) {
                keep_token(to, &token)?;
            }
            return Ok(Some(token));
        }
        let Some(dir) = self.folders.checkpoint_dir else {
            return Ok(None);
        };
        let path = dir.join(TOKEN_NAME);
        if path.exists() {
            return Ok(Some(JobToken::resolve(None, Some(&path))?));
        }
        let token = JobToken::generate();
        keep_token(dir, &token)?;
        Ok(Some(token))
    }

    /// The token given with `--token`, `--token-file` or the environment (`None`: `launch`
    /// makes a fresh one).
    fn given_token(&self) -> Result<Option<JobToken>, TokenError> {
        match JobToken::resolve(self.token, self.token_file) {
            Ok(token) => Ok(Some(token)),
            Err(AuthError::NoToken) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Keeps `token` as `dir/job.token` (mode 0600), replacing a file of another token there.
pub fn keep_token(dir: &Path, token: &JobToken) -> Result<(), TokenError> {
    std::fs::create_dir_all(dir).map_err(FileError::of("creating", dir))?;
    let path = dir.join(TOKEN_NAME);
    if path.exists() {
        if JobToken::resolve(None, Some(&path)).is_ok_and(|t| t.to_hex() == token.to_hex()) {
            return Ok(());
        }
        std::fs::remove_file(&path).map_err(FileError::of("replacing", &path))?;
    }
    write_secret(&path, &token.to_hex())
}

/// Writes `text` to a new file at `path` that only its owner may read.
pub fn write_secret(path: &Path, text: &str) -> Result<(), TokenError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(FileError::of("creating", path))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(FileError::of("writing", path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &Path) -> TokenSources<'_> {
        TokenSources {
            token: None,
            token_file: None,
            folders: JobFolders {
                checkpoint_dir: Some(dir),
                resume: None,
            },
        }
    }

    #[test]
    fn a_fresh_job_keeps_its_token_beside_its_checkpoints_and_finds_it_again() {
        if std::env::var(TOKEN_ENV).is_ok() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let first = sources(dir.path()).launch_token().unwrap().unwrap();
        let again = sources(dir.path()).launch_token().unwrap().unwrap();
        assert_eq!(first.to_hex(), again.to_hex());
        let mode = std::fs::metadata(dir.path().join(TOKEN_NAME)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
    }

    #[test]
    fn a_missing_resume_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let mut s = sources(dir.path());
        s.folders.resume = Some(&gone);
        let err = s.launch_token().unwrap_err().to_string();
        assert!(err.contains("no such folder"), "{err}");
    }

    #[test]
    fn keeping_another_token_replaces_the_file() {
        if std::env::var(TOKEN_ENV).is_ok() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        keep_token(dir.path(), &JobToken::generate()).unwrap();
        let token = JobToken::generate();
        keep_token(dir.path(), &token).unwrap();
        let kept = JobToken::resolve(None, Some(&dir.path().join(TOKEN_NAME))).unwrap();
        assert_eq!(kept.to_hex(), token.to_hex());
    }
}
