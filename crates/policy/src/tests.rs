use super::*;

fn src(name: &str, text: &str) -> Source {
    Source {
        name: name.into(),
        text: text.into(),
    }
}

fn facts(action: Action, resource: &str) -> Facts {
    Facts {
        principal: Principal {
            kind: PrincipalKind::Person,
            id: "alice".into(),
            tenant: "acme".into(),
        },
        action,
        resource: resource.into(),
        job: JobFacts {
            id: "job-1".into(),
            tenant: "acme".into(),
            submitter: "alice".into(),
            labels: [("env".to_owned(), "prod".to_owned())].into(),
        },
        model: "gpt-4o-mini".into(),
        estimate: Estimate {
            priced: true,
            tokens: 1_000,
            micro_usd: 300,
        },
        remaining: Remaining {
            known: true,
            tokens: 10_000,
            micro_usd: 5_000,
        },
        tools: vec!["search".into()],
        outputs: vec![],
        depth: 0,
        plan: vec!["summarize".into()],
        // 2026-11-27 (a Friday) 14:30 UTC.
        now_ms: 1_795_789_800_000,
        arguments: serde_json::json!({"path": "/etc/passwd", "force": true})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        parent_budget: "team".into(),
    }
}

fn resource_of(action: Action) -> &'static str {
    match action {
        Action::SubmitJob => "job-1",
        Action::Spend => "gpt-4o-mini",
        Action::CallTool => "delete_repo",
        Action::Delegate | Action::HandOff => "reviewer",
        Action::NestBudget => "team-a",
        Action::Publish => "propose_pr",
    }
}

#[test]
fn the_schema_parses_and_every_action_s_facts_fit_it() {
    assert!(schema().is_ok(), "{:?}", schema().err());
    for action in Action::ALL {
        for kind in [
            PrincipalKind::Person,
            PrincipalKind::Agent,
            PrincipalKind::Service,
        ] {
            let mut f = facts(action, resource_of(action));
            f.principal.kind = kind;
            assert_eq!(f.validated(), Ok(()), "{action:?} by {kind:?}");
        }
        assert_eq!(Action::parse(action.as_str()), Some(action));
    }
}

#[test]
fn every_decision_kind_on_every_action_kind() {
    for action in Action::ALL {
        let a = action.as_str();
        let set = PolicySet::load(&[src(
            "p.cedar",
            &format!(
                r#"
@id("auto") permit(principal, action == Action::"{a}", resource) when {{ context.estimate.micro_usd < 100 }};
@id("two") @approvers("2") @message("large") permit(principal, action == Action::"{a}", resource) when {{ context.estimate.micro_usd >= 100 && context.estimate.micro_usd < 1000 }};
@id("never") @message("far too large") forbid(principal, action == Action::"{a}", resource) when {{ context.estimate.micro_usd >= 1000 }};
"#
            ),
        )])
        .expect("loads");
        let mut f = facts(action, resource_of(action));
        f.estimate.micro_usd = 50;
        assert_eq!(
            set.decide(&f).verdict,
            Verdict::Permit {
                by: vec!["auto".into()]
            },
            "{a}"
        );
        f.estimate.micro_usd = 500;
        assert_eq!(
            set.decide(&f).verdict,
            Verdict::Require {
                by: vec!["two".into()],
                approvers: 2,
                message: "large".into()
            },
            "{a}"
        );
        f.estimate.micro_usd = 5_000;
        let d = set.decide(&f);
        assert_eq!(
            d.verdict,
            Verdict::Forbid {
                by: vec!["never".into()],
                message: "far too large".into()
            },
            "{a}"
        );
        assert_eq!(d.explain(), "forbidden by never: far too large");
        assert_eq!(d.version, set.version());
        // Another action is not decided by these.
        let other = Action::ALL
            .into_iter()
            .find(|o| *o != action)
            .unwrap_or(action);
        let f = facts(other, resource_of(other));
        assert_eq!(
            set.decide(&f).verdict,
            Verdict::Default,
            "{a} policies on {other:?}"
        );
    }
}

#[test]
fn a_forbid_beats_a_requirement_which_beats_an_auto_approval() {
    let set = PolicySet::load(&[src(
        "p.cedar",
        r#"
@id("all") permit(principal, action, resource);
@id("ask") @approval("required") permit(principal, action == Action::"spend", resource);
@id("no-prod-writes") forbid(principal, action == Action::"call_tool", resource == Tool::"delete_repo")
  when { context.job.hasTag("env") && context.job.getTag("env") == "prod" };
"#,
    )])
    .expect("loads");
    assert!(matches!(
        set.decide(&facts(Action::Spend, "gpt-4o-mini")).verdict,
        Verdict::Require { approvers: 1, .. }
    ));
    let d = set.decide(&facts(Action::CallTool, "delete_repo"));
    assert_eq!(d.verdict.effect(), "forbid");
    assert_eq!(
        d.explain(),
        "forbidden by no-prod-writes: the action is forbidden by policy"
    );
    assert_eq!(
        set.decide(&facts(Action::CallTool, "search")).verdict,
        Verdict::Permit {
            by: vec!["all".into()]
        }
    );
}

#[test]
fn tool_arguments_labels_and_the_clock_are_there_to_decide_on() {
    let set = PolicySet::load(&[src(
        "p.cedar",
        r#"
@id("no-etc") @message("writes under /etc are refused")
forbid(principal, action == Action::"call_tool", resource)
  when { resource.hasTag("path") && resource.getTag("path") like "/etc/*" };
@id("forced") @approvers("2")
permit(principal, action == Action::"call_tool", resource)
  when { resource.hasTag("force") && resource.getTag("force") == "true" };
@id("office-hours") forbid(principal, action == Action::"submit_job", resource)
  when { context.now.weekday > 5 || context.now.hour < 8 || context.now.hour >= 18 };
"#,
    )])
    .expect("loads");
    let mut f = facts(Action::CallTool, "write_file");
    assert_eq!(
        set.decide(&f).explain(),
        "forbidden by no-etc: writes under /etc are refused"
    );
    f.arguments.insert("path".into(), "/tmp/x".into());
    assert_eq!(
        set.decide(&f).verdict,
        Verdict::Require {
            by: vec!["forced".into()],
            approvers: 2,
            message: "required by policy forced".into()
        }
    );
    f.arguments.remove("force");
    assert_eq!(set.decide(&f).verdict, Verdict::Default);
    // Friday 14:30 is inside; Saturday is not.
    let mut f = facts(Action::SubmitJob, "job-1");
    assert_eq!(f.clock().1, 14);
    assert_eq!(f.clock().2, 5);
    assert_eq!(set.decide(&f).verdict, Verdict::Default);
    f.now_ms += 24 * 3600 * 1000;
    assert_eq!(set.decide(&f).verdict.effect(), "forbid");
}

#[test]
fn a_broken_set_is_refused_whole_with_what_is_wrong() {
    let good = src(
        "good.cedar",
        r#"@id("ok") permit(principal, action == Action::"spend", resource);"#,
    );
    let cases = [
        (
            "not cedar",
            "permit(principal, action, resource",
            "not a Cedar policy",
        ),
        (
            "unknown attribute",
            r#"permit(principal, action == Action::"spend", resource) when { context.estimate.dollars > 1 };"#,
            "does not fit the schema",
        ),
        (
            "string compared as a number",
            r#"permit(principal, action == Action::"spend", resource) when { context.model > 1 };"#,
            "does not fit the schema",
        ),
        (
            "unknown action",
            r#"permit(principal, action == Action::"fly", resource);"#,
            "does not fit the schema",
        ),
        (
            "bad approvers",
            r#"@approvers("9") permit(principal, action, resource);"#,
            "from 1 to 5",
        ),
        (
            "approval on a forbid",
            r#"@approval("required") forbid(principal, action, resource);"#,
            "applies to permit",
        ),
        (
            "unknown approval value",
            r#"@approval("maybe") permit(principal, action, resource);"#,
            "is not understood",
        ),
        (
            "duplicate id",
            r#"@id("ok") permit(principal, action, resource);"#,
            "used twice",
        ),
        (
            "a tag read without hasTag",
            r#"forbid(principal, action == Action::"call_tool", resource) when { resource.getTag("path") == "/" };"#,
            "does not fit the schema",
        ),
    ];
    for (what, text, expect) in cases {
        let err = PolicySet::load(&[good.clone(), src("bad.cedar", text)])
            .expect_err(what)
            .to_string();
        assert!(err.contains(expect), "{what}: {err}");
        assert!(
            err.contains("bad.cedar") || what == "duplicate id",
            "{what} names its file: {err}"
        );
    }
}

#[test]
fn ids_come_from_the_id_annotation_or_the_file_and_position() {
    let set = PolicySet::load(&[src(
        "team.cedar",
        r#"permit(principal, action == Action::"spend", resource);
           @id("named") forbid(principal, action == Action::"publish", resource);
           permit(principal, action == Action::"delegate", resource);"#,
    )])
    .expect("loads");
    assert_eq!(set.ids(), vec!["named", "team.cedar#0", "team.cedar#2"]);
    assert_eq!(
        set.decide(&facts(Action::Delegate, "reviewer")).verdict,
        Verdict::Permit {
            by: vec!["team.cedar#2".into()]
        }
    );
}

#[test]
fn the_version_is_the_content_hash() {
    let a = [src("a.cedar", r#"permit(principal, action, resource);"#)];
    let b = [src("a.cedar", r#"forbid(principal, action, resource);"#)];
    let v = PolicySet::load(&a).expect("a").version().to_owned();
    assert_eq!(v, PolicySet::load(&a).expect("a again").version());
    assert_ne!(v, PolicySet::load(&b).expect("b").version());
    assert!(v.starts_with("sha256:") && v.len() == 71);
    assert_eq!(
        PolicySet::empty()
            .decide(&facts(Action::Spend, "m"))
            .verdict,
        Verdict::Default
    );
}

#[test]
fn a_broken_reload_keeps_the_set_in_force_and_a_fixed_one_replaces_it() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("spend.cedar");
    let write = |t: &str| std::fs::write(&file, t).expect("write");
    write(
        r#"@id("small") permit(principal, action == Action::"spend", resource) when { context.estimate.micro_usd < 1000 };"#,
    );
    let engine = Engine::new(vec![], Some(dir.path().to_owned())).expect("loads");
    let first = engine.current().version().to_owned();
    let f = facts(Action::Spend, "gpt-4o-mini");
    assert_eq!(engine.decide(&f).verdict.effect(), "permit");
    assert_eq!(engine.reload(), Ok(false), "nothing changed");

    write("permit(principal, action, resource) when { context.nope };");
    let err = engine.reload().expect_err("refused");
    assert!(err.to_string().contains("spend.cedar"), "{err}");
    assert_eq!(engine.current().version(), first, "the old set stays");
    assert_eq!(engine.decide(&f).verdict.effect(), "permit");
    let status = engine.status().borrow().clone();
    assert!(
        status.refused.contains("does not fit the schema"),
        "{status:?}"
    );
    assert_eq!(status.version, first);
    assert_eq!(
        engine.reload(),
        Ok(false),
        "the same broken files are not news"
    );

    write(r#"@id("none") forbid(principal, action == Action::"spend", resource);"#);
    assert_eq!(engine.reload(), Ok(true));
    assert_ne!(engine.current().version(), first);
    assert_eq!(engine.decide(&f).verdict.effect(), "forbid");
    assert!(engine.status().borrow().refused.is_empty());

    // A process does not start on a broken set.
    write("forbid(");
    assert!(Engine::new(vec![], Some(dir.path().to_owned())).is_err());
}

#[test]
fn evaluating_only_the_policies_in_scope_decides_as_evaluating_them_all() {
    let set = PolicySet::load(&[src(
        "p.cedar",
        r#"
@id("any") @approval("required") permit(principal, action, resource) when { context.estimate.micro_usd > 900 };
@id("model-a") permit(principal, action == Action::"spend", resource == Model::"a");
@id("models-in") forbid(principal, action in [Action::"spend", Action::"publish"], resource in Model::"b");
@id("tool-x") @approvers("3") permit(principal, action == Action::"call_tool", resource == Tool::"x");
@id("tool-x-etc") forbid(principal, action == Action::"call_tool", resource == Tool::"x")
  when { resource.hasTag("path") && resource.getTag("path") like "/etc/*" };
@id("agents") forbid(principal is Agent, action == Action::"delegate", resource);
@id("tools-any") permit(principal, action == Action::"call_tool", resource is Tool);
"#,
    )])
    .expect("loads");
    let mut seen = std::collections::BTreeSet::new();
    for action in Action::ALL {
        for resource in ["a", "b", "x", "y", "job-1", "reviewer"] {
            for cost in [0, 1000] {
                for path in ["/etc/x", "/tmp"] {
                    for kind in [PrincipalKind::Person, PrincipalKind::Agent] {
                        let mut f = facts(action, resource);
                        f.estimate.micro_usd = cost;
                        f.principal.kind = kind;
                        f.arguments.insert("path".into(), path.into());
                        let (fast, all) = (set.decide_in(&f, true), set.decide_in(&f, false));
                        assert_eq!(fast, all, "{action:?} {resource} {cost} {path} {kind:?}");
                        seen.insert(fast.verdict.effect());
                    }
                }
            }
        }
    }
    assert_eq!(seen.len(), 4, "every effect was decided: {seen:?}");
}

#[test]
fn a_policy_reads_what_the_budget_has_left_and_an_unlimited_budget_never_looks_short() {
    let set = PolicySet::load(&[src(
        "p.cedar",
        r#"
@id("short") @message("the budget is nearly spent") forbid(principal, action == Action::"submit_job", resource)
  when { context.remaining.known && context.remaining.micro_usd < context.estimate.micro_usd * 2 };
"#,
    )])
    .expect("loads");
    let mut f = facts(Action::SubmitJob, "job-1");
    f.estimate.micro_usd = 300;
    // The job's own $0.005 and a team budget with 500 micro-USD left: the
    // lesser binds.
    f.remaining = Remaining::left(None, Some(5_000)).min(Remaining::left(Some(9), Some(500)));
    assert_eq!(f.remaining.tokens, 9);
    assert!(matches!(set.decide(&f).verdict, Verdict::Forbid { .. }));
    f.remaining = Remaining::left(Some(100), None);
    assert!(f.remaining.known);
    assert_eq!(set.decide(&f).verdict, Verdict::Default);
    f.remaining = Remaining::left(None, None);
    assert!(!f.remaining.known);
    assert_eq!(set.decide(&f).verdict, Verdict::Default);
    assert_eq!(Remaining::left(None, None).min(f.remaining), f.remaining);
}

#[test]
fn remaining_amounts_read_back_what_left_was_given() {
    for (t, c) in [
        (None, None),
        (Some(5), None),
        (None, Some(7)),
        (Some(0), Some(0)),
    ] {
        assert_eq!(Remaining::left(t, c).amounts(), (t, c));
    }
}

/// Eats stack until less than `left` bytes remain, then runs `f`.
fn with_stack_left<T>(left: usize, f: impl FnOnce() -> T) -> T {
    #[inline(never)]
    fn eat<T>(left: usize, f: Box<dyn FnOnce() -> T + '_>) -> T {
        let pad = std::hint::black_box([0u8; 4096]);
        if stacker::remaining_stack().is_some_and(|r| r > left) {
            let out = eat(left, f);
            std::hint::black_box(&pad);
            out
        } else {
            f()
        }
    }
    eat(left, Box::new(f))
}

#[test]
fn a_decision_made_deep_in_a_call_stack_is_decided_not_refused() {
    // A permit that Cedar must evaluate: refused for want of stack, it
    // would fall to the default (a person).
    let set = PolicySet::load(&[src(
        "cheap",
        r#"@id("cheap") permit(principal, action == Action::"spend", resource) when { context.estimate.micro_usd <= 300 };"#,
    )])
    .unwrap();
    let f = facts(Action::Spend, "gpt-4o-mini");
    let decided = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || with_stack_left(120 * 1024, || set.decide(&f)))
        .unwrap()
        .join()
        .unwrap();
    assert!(decided.errors.is_empty(), "{:?}", decided.errors);
    assert_eq!(decided.verdict.effect(), "permit", "{decided:?}");
}
