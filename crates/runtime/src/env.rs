//! Who am I in a multi-machine job: rank, world size and the coordinator's address, as
//! told by the launcher that started this process.
//!
//! Recognised launchers, tried in this order (the first whose rank variable is set wins):
//!
//! | launcher | rank | world size | local rank |
//! |---|---|---|---|
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! In every case the coordinator's address comes from `MASTER_ADDR` and `MASTER_PORT`
//! (default port [`DEFAULT_MASTER_PORT`]); `MASTER_ADDR` is required when the job has more
//! than one process and defaults to `127.0.0.1` otherwise.

use std::str::FromStr;

/// Port of the coordinator when `MASTER_PORT` is not set (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// This process's place in a job started by an external launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank of this process.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Host of the coordinator (rank 0).
    pub master_addr: String,
    /// Port of the coordinator.
    pub master_port: u16,
    /// Rank within this machine, when the launcher says.
    pub local_rank: Option<usize>,
    /// Which launcher the values came from ("torchrun", "Open MPI", "Slurm").
    pub source: &'static str,
}

/// A launcher environment that is present but unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A variable that does not parse.
    #[error("{var}={value:?} is not a valid {what}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        what: &'static str,
    },
    /// The rank is set but the world size is not.
    #[error("{launcher} launch: {present} is set but {missing} is not")]
    Missing {
        /// The launcher.
        launcher: &'static str,
        /// The variable found.
        present: &'static str,
        /// The variable missing.
        missing: &'static str,
    },
    /// The rank is not below the world size.
    #[error("{launcher} launch: rank {rank} is not below the world size {world_size}")]
    RankOutOfRange {
        /// The launcher.
        launcher: &'static str,
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// A multi-process job without `MASTER_ADDR`.
    #[error(
        "{launcher} launch of {world_size} processes needs MASTER_ADDR \
         (the host of rank 0, where the coordinator listens), which is not set"
    )]
    NoMasterAddr {
        /// The launcher.
        launcher: &'static str,
        /// The world size.
        world_size: usize,
    },
}

struct Launcher {
    name: &'static str,
    rank: &'static str,
    world_size: &'static str,
    local_rank: &'static str,
}

const LAUNCHERS: [Launcher; 3] = [
    Launcher {
        name: "torchrun",
        rank: "RANK",
        world_size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
    },
    Launcher {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        world_size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
    },
    Launcher {
        name: "Slurm",
        rank: "SLURM_PROCID",
        world_size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
    },
];

/// Reads the launcher environment of this process; `Ok(None)` when no launcher set it.
pub fn from_env() -> Result<Option<LaunchEnv>, EnvError> {
    from_vars(&|name| std::env::var(name).ok())
}

/// Like [`from_env`], with `var` looking variables up (for tests).
pub fn from_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>, EnvError> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let Some((launcher, rank)) = LAUNCHERS
        .iter()
        .find_map(|l| get(l.rank).map(|value| (l, value)))
    else {
        return Ok(None);
    };
    let rank: usize = parse(launcher.rank, &rank, "rank")?;
    let world_size = get(launcher.world_size).ok_or(EnvError::Missing {
        launcher: launcher.name,
        present: launcher.rank,
        missing: launcher.world_size,
    })?;
    let world_size: usize = parse(launcher.world_size, &world_size, "world size")?;
    if rank >= world_size {
        return Err(EnvError::RankOutOfRange {
            launcher: launcher.name,
            rank,
            world_size,
        });
    }
    let local_rank = get(launcher.local_rank)
        .map(|v| parse(launcher.local_rank, &v, "local rank"))
        .transpose()?;
    let master_addr = match get("MASTER_ADDR") {
        Some(addr) => addr.trim().to_owned(),
        None if world_size == 1 => "127.0.0.1".to_owned(),
        None => {
            return Err(EnvError::NoMasterAddr {
                launcher: launcher.name,
                world_size,
            })
        }
    };
    let master_port = match get("MASTER_PORT") {
        Some(port) => parse::<u16>("MASTER_PORT", &port, "port (1-65535)")
            .and_then(|p| nonzero_port(p, &port))?,
        None => DEFAULT_MASTER_PORT,
    };
    Ok(Some(LaunchEnv {
        rank,
        world_size,
        master_addr,
        master_port,
        local_rank,
        source: launcher.name,
    }))
}

fn parse<T: FromStr>(var: &'static str, value: &str, what: &'static str) -> Result<T, EnvError> {
    value.trim().parse().map_err(|_| EnvError::Invalid {
        var,
        value: value.to_owned(),
        what,
    })
}

fn nonzero_port(port: u16, value: &str) -> Result<u16, EnvError> {
    if port == 0 {
        return Err(EnvError::Invalid {
            var: "MASTER_PORT",
            value: value.to_owned(),
            what: "port (1-65535)",
        });
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Option<LaunchEnv>, EnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_vars(&|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_is_none() {
        assert_eq!(with(&[("MASTER_ADDR", "h")]), Ok(None));
    }

    #[test]
    fn torchrun() {
        let e = with(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
            ("LOCAL_RANK", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 3,
                world_size: 4,
                master_addr: "node0".into(),
                master_port: 1234,
                local_rank: Some(1),
                source: "torchrun",
            }
        );
    }

    #[test]
    fn open_mpi() {
        let e = with(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("MASTER_ADDR", "10.0.0.1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (1, 2, Some(0)));
        assert_eq!((e.master_addr.as_str(), e.master_port), ("10.0.0.1", 29500));
        assert_eq!(e.source, "Open MPI");
    }

    #[test]
    fn slurm() {
        let e = with(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("MASTER_ADDR", "n1"),
            ("MASTER_PORT", "4000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (5, 8, Some(1)));
        assert_eq!((e.master_port, e.source), (4000, "Slurm"));
    }

    #[test]
    fn torchrun_wins_over_slurm() {
        let e = with(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (e.source, e.rank, e.master_addr.as_str()),
            ("torchrun", 0, "127.0.0.1")
        );
    }

    #[test]
    fn errors_name_the_variable() {
        let e = with(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x\""), "{e}");
        let e = with(&[("SLURM_PROCID", "0")]).unwrap_err();
        assert!(e.to_string().contains("SLURM_NTASKS"), "{e}");
        let e = with(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(matches!(e, EnvError::RankOutOfRange { .. }), "{e}");
        let e = with(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert!(e.unwrap_err().to_string().contains("MASTER_ADDR"));
        for port in ["0", "70000", "http"] {
            let e = with(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", port)]).unwrap_err();
            assert!(e.to_string().contains("MASTER_PORT"), "{e}");
        }
        let e = with(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "-1")]).unwrap_err();
        assert!(e.to_string().contains("LOCAL_RANK"), "{e}");
    }
}
