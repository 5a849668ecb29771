//! Generated protobuf and gRPC code for every Switchyard contract in `proto/`.
//!
//! Services, clients and the CLI depend on this crate; nothing here is written
//! by hand except the module tree. [`FILE_DESCRIPTOR_SET`] feeds server
//! reflection so `grpcurl list/describe` works against any Switchyard process.
#![allow(clippy::all, missing_docs)]

/// Encoded `FileDescriptorSet` of all Switchyard protos (for reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("switchyard_descriptor");

/// `switchyard.common.v1`: correlation, money, tokens, the event envelope.
pub mod common {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.common.v1");
    }
}

/// `switchyard.auth.v1`: API keys and who-am-i.
pub mod auth {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.auth.v1");
    }
}

/// `switchyard.registry.v1`: agents, tools, leases, outcomes, watch.
pub mod registry {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.registry.v1");
    }
}

/// `switchyard.router.v1`: capability routing.
pub mod router {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.router.v1");
    }
}

/// `switchyard.ledger.v1`: budgets, reservations, the cost journal.
pub mod ledger {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.ledger.v1");
    }
}

/// `switchyard.approval.v1`: AgentRunSpec runs, policies, audit.
pub mod approval {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.approval.v1");
    }
}

/// `switchyard.executor.v1`: jobs, tasks, events.
pub mod executor {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.executor.v1");
    }
}

/// `switchyard.agent.v1`: the contract agents implement.
pub mod agent {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("switchyard.agent.v1");
    }
}
