use super::*;
use switchyard_kit::auth::AuthError as Refused;

fn open() -> (Auth, KeySet) {
    let set = KeySet::default();
    (
        Auth::open(Store::temporary().unwrap(), set.clone()).unwrap(),
        set,
    )
}

fn admin(tenant: &str) -> Creator {
    Creator {
        subject: "root".into(),
        tenant: tenant.into(),
    }
}

fn req(subject: &str, roles: &[&str]) -> CreateKeyRequest {
    CreateKeyRequest {
        subject: subject.into(),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_created_key_verifies_until_revoked_and_then_at_once_not() {
    let (auth, set) = open();
    let made = auth
        .create(&admin("acme"), req("ci", &["submitter"]))
        .await
        .unwrap();
    let key = made.key.unwrap();
    let p = set.verify(&made.secret, now_ms()).unwrap();
    assert_eq!((p.subject.as_str(), p.tenant.as_str()), ("ci", "acme"));
    assert!(p.roles.has(Role::Submitter));
    let stored = auth.inner.tree.get(&key.key_id).unwrap().unwrap();
    assert_eq!(stored.token_sha256, keys::hash(&made.secret).to_vec());
    assert!(
        !format!("{stored:?}").contains(&made.secret),
        "the secret is never stored"
    );

    auth.revoke("acme", "root", &key.key_id).await.unwrap();
    assert_eq!(set.verify(&made.secret, now_ms()), Err(Refused::Invalid));
    assert!(auth.list("acme", false).is_empty());
    assert_eq!(auth.list("acme", true)[0].revoked_by, "root");
}

#[tokio::test]
async fn keys_are_refused_service_roles_unknown_roles_and_other_tenants() {
    let (auth, _) = open();
    for (r, field) in [
        (req("x", &["service"]), "roles"),
        (req("x", &["impersonate", "viewer"]), "roles"),
        (req("x", &["root"]), "roles"),
        (req("x", &[]), "roles"),
        (req("has space", &["viewer"]), "subject"),
        (
            CreateKeyRequest {
                tenant: "other".into(),
                ..req("x", &["viewer"])
            },
            "tenant",
        ),
        (
            CreateKeyRequest {
                kind: PrincipalKind::Service as i32,
                ..req("x", &["viewer"])
            },
            "kind",
        ),
    ] {
        match auth.create(&admin("acme"), r).await {
            Err(AuthError::Invalid(v)) => assert_eq!(v.0[0].field, field),
            other => panic!("expected a {field} violation, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn another_tenants_key_is_not_found_and_not_listed() {
    let (auth, set) = open();
    let made = auth
        .create(&admin("acme"), req("ci", &["viewer"]))
        .await
        .unwrap();
    let id = made.key.unwrap().key_id;
    assert!(matches!(
        auth.revoke("globex", "mallory", &id).await,
        Err(AuthError::KeyNotFound(_))
    ));
    assert!(auth.list("globex", true).is_empty());
    assert!(set.verify(&made.secret, now_ms()).is_ok(), "still valid");
}

#[tokio::test]
async fn expired_keys_verify_as_expired() {
    let (auth, set) = open();
    let made = auth
        .create(
            &admin("acme"),
            CreateKeyRequest {
                ttl_secs: 1,
                ..req("short", &["viewer"])
            },
        )
        .await
        .unwrap();
    assert!(set.verify(&made.secret, now_ms()).is_ok());
    assert_eq!(
        set.verify(&made.secret, now_ms() + 1_001),
        Err(Refused::Expired)
    );
}

#[tokio::test]
async fn keys_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let secret = {
        let (auth, _) = (
            Auth::open(Store::open(dir.path()).unwrap(), KeySet::default()).unwrap(),
            (),
        );
        let s = auth
            .create(&admin("acme"), req("ci", &["viewer"]))
            .await
            .unwrap()
            .secret;
        auth.flush().unwrap();
        s
    };
    let set = KeySet::default();
    let _auth = Auth::open(
        Store::reopen(dir.path(), Duration::from_secs(2))
            .await
            .unwrap(),
        set.clone(),
    )
    .unwrap();
    assert_eq!(set.verify(&secret, now_ms()).unwrap().subject, "ci");
}

#[tokio::test]
async fn dev_bootstrap_writes_a_private_file_once_and_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let (auth, set) = open();
    let path = auth.bootstrap_dev(dir.path()).await.unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let creds = credentials::Credentials::read(&path).unwrap();
    let bob = set.verify(creds.token("bob").unwrap(), now_ms()).unwrap();
    assert!(bob.roles.has(Role::Approver) && !bob.roles.has(Role::Submitter));
    let admin = set.verify(creds.token("admin").unwrap(), now_ms()).unwrap();
    assert!(
        !admin
            .roles
            .grant(switchyard_kit::auth::Permission::RunDecide)
    );
    assert!(!format!("{creds:?}").contains(creds.token("alice").unwrap()));

    auth.bootstrap_dev(dir.path()).await.unwrap();
    assert_eq!(
        credentials::Credentials::read(&path).unwrap(),
        creds,
        "kept"
    );
    assert_eq!(auth.list("default", false).len(), 4);
}

#[tokio::test]
async fn a_follower_sees_new_keys_and_revocations() {
    let (auth, _) = open();
    let follower = KeySet::default();
    let (trigger, shutdown) = switchyard_kit::shutdown::channel();
    let mut ready = spawn_follow(
        switchyard_api::AuthClient::local(Arc::new(auth.clone())),
        follower.clone(),
        shutdown,
    );
    ready.wait_for(|r| *r).await.unwrap();
    let made = auth
        .create(&admin("acme"), req("ci", &["viewer"]))
        .await
        .unwrap();
    let wait = |want_ok: bool| {
        let follower = follower.clone();
        let secret = made.secret.clone();
        async move {
            for _ in 0..500 {
                if follower.verify(&secret, now_ms()).is_ok() == want_ok {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("follower never reached ok={want_ok}");
        }
    };
    wait(true).await;
    auth.revoke("acme", "root", &made.key.unwrap().key_id)
        .await
        .unwrap();
    wait(false).await;
    trigger.fire();
}

/// A key made by acme's admin, and the principal it authenticates as.
async fn holder(
    auth: &Auth,
    set: &KeySet,
    r: CreateKeyRequest,
) -> (CreateKeyResponse, std::sync::Arc<Principal>) {
    let made = auth.create(&admin("acme"), r).await.unwrap();
    let key = set.verify(&made.secret, now_ms()).unwrap();
    (made, key)
}

fn session_req(ttl_secs: u64) -> StartSessionRequest {
    StartSessionRequest {
        ttl_secs,
        description: "console".into(),
    }
}

#[tokio::test]
async fn a_session_is_a_new_token_for_the_same_person_that_ends_at_sign_out_and_with_its_key() {
    let (auth, set) = open();
    let (made, key) = holder(&auth, &set, req("alice", &["submitter", "approver"])).await;
    let started = auth.start_session(&key, session_req(600)).await.unwrap();
    assert_ne!(started.secret, made.secret);
    let s = set.verify(&started.secret, now_ms()).unwrap();
    assert_eq!(
        (s.subject.as_str(), s.tenant.as_str(), s.roles, s.method),
        ("alice", "acme", key.roles, Method::Session)
    );
    let listed = started.session.unwrap();
    assert_eq!(listed.session_of, made.key.as_ref().unwrap().key_id);
    let ttl = timestamp_ms(listed.expires_at.as_ref().unwrap()) - now_ms();
    assert!(ttl <= 600_000 && ttl > 590_000, "{ttl}");

    // Signing out ends it; the key itself still works.
    auth.end_session(&s).await.unwrap();
    assert_eq!(set.verify(&started.secret, now_ms()), Err(Refused::Invalid));
    assert!(set.verify(&made.secret, now_ms()).is_ok());

    // Revoking the key ends every session started with it.
    let a = auth.start_session(&key, session_req(0)).await.unwrap();
    let b = auth.start_session(&key, session_req(0)).await.unwrap();
    auth.revoke("acme", "root", &made.key.unwrap().key_id)
        .await
        .unwrap();
    for t in [&a.secret, &b.secret] {
        assert_eq!(set.verify(t, now_ms()), Err(Refused::Invalid));
    }
}

#[tokio::test]
async fn a_session_never_outlives_its_credential_nor_a_day() {
    let (auth, set) = open();
    let (made, key) = holder(
        &auth,
        &set,
        CreateKeyRequest {
            ttl_secs: 120,
            ..req("ci", &["viewer"])
        },
    )
    .await;
    let s = auth.start_session(&key, session_req(3600)).await.unwrap();
    let key_expiry = timestamp_ms(made.key.unwrap().expires_at.as_ref().unwrap());
    assert_eq!(
        timestamp_ms(s.session.unwrap().expires_at.as_ref().unwrap()),
        key_expiry
    );
    let (_, key) = holder(&auth, &set, req("ops", &["viewer"])).await;
    let s = auth
        .start_session(&key, session_req(u64::MAX))
        .await
        .unwrap();
    let ttl = timestamp_ms(s.session.unwrap().expires_at.as_ref().unwrap()) - now_ms();
    assert!(ttl <= SESSION_MAX_SECS * 1000, "{ttl}");
}

#[tokio::test]
async fn sessions_start_only_from_a_key_or_token_and_end_only_as_sessions() {
    let (auth, set) = open();
    let (made, key) = holder(&auth, &set, req("alice", &["submitter"])).await;
    let s = auth.start_session(&key, session_req(60)).await.unwrap();
    let session = set.verify(&s.secret, now_ms()).unwrap();
    let service = Principal::service("service:gateway", Method::ServiceToken);
    let acting = service.acting_for(key.user_for_calls().unwrap());
    for (what, p) in [
        ("a session", &*session),
        ("a service", &service),
        ("a service acting for alice", &acting),
    ] {
        assert!(
            matches!(
                auth.start_session(p, session_req(60)).await,
                Err(AuthError::NoSession(_))
            ),
            "{what} started a session"
        );
    }
    // EndSession ends the session it is made with, never a key.
    assert!(matches!(
        auth.end_session(&key).await,
        Err(AuthError::NoSession(_))
    ));
    assert!(set.verify(&made.secret, now_ms()).is_ok());
}

#[tokio::test]
async fn a_subject_holds_a_bounded_number_of_sessions_and_ended_ones_are_forgotten() {
    let (auth, set) = open();
    let (_, key) = holder(&auth, &set, req("alice", &["submitter"])).await;
    let mut secrets = Vec::new();
    for _ in 0..SESSIONS_PER_SUBJECT + 2 {
        secrets.push(
            auth.start_session(&key, session_req(60))
                .await
                .unwrap()
                .secret,
        );
    }
    let live = secrets
        .iter()
        .filter(|t| set.verify(t, now_ms()).is_ok())
        .count();
    assert_eq!(live, SESSIONS_PER_SUBJECT);
    assert!(set.verify(secrets.last().unwrap(), now_ms()).is_ok());
    let ended = secrets
        .iter()
        .find(|t| set.verify(t, now_ms()).is_err())
        .unwrap()
        .clone();

    // A session that ended more than a day ago is deleted at the next start.
    let old = {
        let mut records = auth.records();
        let (id, rec) = records
            .iter_mut()
            .find(|(_, r)| r.token_sha256 == keys::hash(&ended).to_vec())
            .unwrap();
        let k = rec.key.as_mut().unwrap();
        k.revoked_at = Some(timestamp(now_ms() - 25 * 3600 * 1000));
        id.clone()
    };
    auth.start_session(&key, session_req(60)).await.unwrap();
    assert!(!auth.records().contains_key(&old));
    assert!(set.verify(&ended, now_ms()).is_err());
}
