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
        Store::reopen(dir.path(), Duration::from_secs(2)).unwrap(),
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
