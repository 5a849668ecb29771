//! What every Switchyard process offers regardless of services: health with a
//! status per service, and server reflection (v1 and v1alpha) that lists and
//! describes the contracts.

#![allow(clippy::unwrap_used)] // test helpers: a failed call is a failed test

use prost::Message;
use switchyard_cli::ServiceKind;
use switchyard_testkit::Stack;
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Service names advertised by reflection (v1), excluding reflection itself, sorted.
async fn reflected_services(s: &Stack) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut c = ServerReflectionClient::new(s.channel().await.unwrap());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = c
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let mut names: Vec<String> = list
        .service
        .into_iter()
        .map(|s| s.name)
        .filter(|n| !n.starts_with("grpc.reflection."))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn health_reports_each_hosted_service() {
    let s = Stack::start_with(&[ServiceKind::Registry], |_| {})
        .await
        .unwrap();
    let mut h = HealthClient::new(s.channel().await.unwrap());
    assert_eq!(
        reflected_services(&s).await,
        [
            "grpc.health.v1.Health",
            "switchyard.auth.v1.AuthService",
            "switchyard.registry.v1.RegistryService"
        ],
        "every stack hosts its identity source"
    );
    let check = |svc: &str| HealthCheckRequest {
        service: svc.into(),
    };
    let st = h
        .check(check("switchyard.registry.v1.RegistryService"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.status, ServingStatus::Serving as i32);
    let err = h
        .check(check("switchyard.router.v1.RouterService"))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::NotFound,
        "router is not hosted here"
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn reflection_v1_lists_services_and_describes_a_method() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    // Only hosted services are advertised.
    let lone = Stack::start_with(&[ServiceKind::Ledger], |_| {})
        .await
        .unwrap();
    let names = reflected_services(&lone).await;
    assert!(
        !names
            .iter()
            .any(|n| n == "switchyard.executor.v1.JobService"),
        "only hosted services are advertised: {names:?}"
    );
    lone.stop().await.unwrap();
    let s = Stack::start().await.unwrap();
    let names = reflected_services(&s).await;
    for want in [
        "switchyard.executor.v1.JobService",
        "switchyard.agent.v1.AgentService",
        "switchyard.registry.v1.RegistryService",
        "switchyard.router.v1.RouterService",
        "switchyard.ledger.v1.LedgerService",
        "switchyard.approval.v1.ApprovalService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    let mut c = ServerReflectionClient::new(s.channel().await.unwrap());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "switchyard.router.v1.RouterService.Route".into(),
        )),
    };
    let mut stream = c
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::FileDescriptorResponse(fd)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected file descriptors");
    };
    let files: Vec<prost_types::FileDescriptorProto> = fd
        .file_descriptor_proto
        .iter()
        .map(|b| prost_types::FileDescriptorProto::decode(b.as_slice()).unwrap())
        .collect();
    let router = files
        .iter()
        .find(|f| f.package() == "switchyard.router.v1")
        .expect("router file");
    let method = &router.service[0].method[0];
    assert_eq!(
        (method.name(), method.input_type(), method.output_type()),
        (
            "Route",
            ".switchyard.router.v1.RouteRequest",
            ".switchyard.router.v1.RouteResponse"
        )
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn reflection_v1alpha_answers_for_older_clients_like_grpcurl() {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let s = Stack::start().await.unwrap();
    let mut c = ServerReflectionClient::new(s.channel().await.unwrap());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = c
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "switchyard.registry.v1.RegistryService")
    );
    s.stop().await.unwrap();
}
