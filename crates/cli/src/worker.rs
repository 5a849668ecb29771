//! `switchyard worker ...`: operate pull workers (drain or stop one).

use clap::{Subcommand, ValueEnum};
use switchyard_api::WorkerClient;
use switchyard_proto::executor::v1::{SetWorkerStateRequest, WorkerState};

use crate::client::{Conn, MAX_MESSAGE, api};
use crate::output::{Format, print_json};

/// `switchyard worker ...`
#[derive(Debug, Subcommand)]
pub enum WorkerCmd {
    /// Set a pull worker's state; it learns at its next heartbeat or fetch.
    /// Needs `worker.manage` (operators, admins).
    State {
        /// The worker's id (as it fetches).
        worker_id: String,
        /// running: fetch as usual; quiet: finish what it holds, fetch
        /// nothing more; terminate: hand its tasks back and exit.
        state: State,
        #[command(flatten)]
        conn: Conn,
    },
}

/// A worker state on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum State {
    /// Fetch as usual.
    Running,
    /// Finish what it holds; fetch nothing more.
    Quiet,
    /// Hand its tasks back and exit.
    Terminate,
}

impl State {
    fn wire(self) -> WorkerState {
        match self {
            State::Running => WorkerState::Running,
            State::Quiet => WorkerState::Quiet,
            State::Terminate => WorkerState::Terminate,
        }
    }
}

/// Runs a `worker` command.
pub async fn run(cmd: WorkerCmd) -> anyhow::Result<()> {
    match cmd {
        WorkerCmd::State {
            worker_id,
            state,
            conn,
        } => {
            let c = WorkerClient::remote(conn.channel().await?, MAX_MESSAGE);
            let out = c
                .set_worker_state(SetWorkerStateRequest {
                    worker_id: worker_id.clone(),
                    state: state.wire() as i32,
                })
                .await
                .map_err(api)?;
            let now = WorkerState::try_from(out.state)
                .map_or("unknown", |s| s.as_str_name())
                .trim_start_matches("WORKER_STATE_")
                .to_lowercase();
            match conn.output {
                Format::Json => {
                    print_json(&serde_json::json!({"worker_id": worker_id, "state": now}))
                }
                Format::Table => println!("worker {worker_id}: {now}"),
            }
            Ok(())
        }
    }
}
