use super::*;

#[test]
fn permits_are_rendered_for_host_tenants_and_types() {
    let text = Metrics::default().render(&Gauges {
        host_permits: (3, 8),
        tenant_permits: BTreeMap::from([("a".to_owned(), (2, 4))]),
        type_permits: BTreeMap::from([(("a".to_owned(), "Greet".to_owned()), (1, 2))]),
    });
    for line in [
        "corral_permits_in_use{scope=\"host\"} 3",
        "corral_permits_limit{scope=\"host\"} 8",
        "corral_permits_in_use{scope=\"tenant\",tenant=\"a\"} 2",
        "corral_permits_limit{scope=\"tenant\",tenant=\"a\"} 4",
        "corral_permits_in_use{scope=\"type\",tenant=\"a\",activity_type=\"Greet\"} 1",
        "corral_permits_limit{scope=\"type\",tenant=\"a\",activity_type=\"Greet\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}

#[test]
fn a_types_cpu_counters_stop_at_their_most_rather_than_wrap() {
    let m = Metrics::default();
    let almost = Duration::from_nanos(u64::MAX - 10);
    let used = CpuUse {
        cpu: almost,
        waited: almost,
    };
    m.cpu_used("a", "x", used);
    m.cpu_used("a", "x", used);
    let most = Duration::from_nanos(u64::MAX);
    assert_eq!((m.cpu("a").used, m.cpu("a").waited), (most, most));
}

#[test]
fn cpu_is_counted_per_tenant_and_type_and_rendered_escaped() {
    let m = Metrics::default();
    let used = |ms| CpuUse {
        cpu: Duration::from_millis(ms),
        waited: Duration::from_millis(ms / 2),
    };
    m.cpu_used("a", "x", used(40));
    m.cpu_used("a", "x", used(20));
    m.cpu_used("a", "w\"\n", used(100));
    m.cpu_throttled("a", Duration::from_millis(250));
    assert_eq!(
        m.cpu("a"),
        TenantCpu {
            used: Duration::from_millis(160),
            waited: Duration::from_millis(80),
            throttled: Duration::from_millis(250),
        }
    );
    assert_eq!(m.cpu("b"), TenantCpu::default());
    let text = m.render(&Gauges::default());
    for line in [
        "corral_tenant_cpu_seconds_total{tenant=\"a\",activity_type=\"x\"} 0.06",
        "corral_tenant_cpu_wait_seconds_total{tenant=\"a\",activity_type=\"x\"} 0.03",
        "corral_tenant_cpu_seconds_total{tenant=\"a\",activity_type=\"w\\\"\\n\"} 0.1",
        "corral_tenant_cpu_throttled_seconds_total{tenant=\"a\"} 0.25",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}

#[test]
fn outcomes_are_counted_per_tenant_and_rendered() {
    let m = Metrics::default();
    m.task_started("a");
    m.task_started("a");
    m.task_finished("a", "x", COMPLETED, Duration::from_millis(2));
    m.task_finished("a", "x", "Trap", Duration::from_millis(20));
    m.task_started("a");
    m.task_finished("a", "w", COMPLETED, Duration::from_millis(3));
    m.task_started("b");
    m.task_finished("b", "y\"z", COMPLETED, Duration::from_secs(2));
    assert_eq!(m.in_flight("a"), 0);
    assert_eq!(
        m.outcomes("a"),
        // Summed over the tenant's activity types, none of "b"'s.
        BTreeMap::from([(COMPLETED.to_owned(), 2), ("Trap".to_owned(), 1)])
    );
    let text = m.render(&Gauges::default());
    assert!(
        text.contains("corral_tasks_total{tenant=\"a\",activity_type=\"x\",outcome=\"Trap\"} 1")
    );
    assert!(text.contains("activity_type=\"y\\\"z\""), "{text}");
    assert!(text.contains(
        "corral_task_duration_seconds_bucket{tenant=\"a\",activity_type=\"x\",le=\"0.005\"} 1"
    ));
    assert!(text.contains(
        "corral_task_duration_seconds_bucket{tenant=\"a\",activity_type=\"x\",le=\"+Inf\"} 2"
    ));
}

#[test]
fn signature_refusals_are_counted_per_tenant_and_reason() {
    let m = Metrics::default();
    m.signature_refused("a\"b", "unsigned");
    m.signature_refused("a\"b", "unsigned");
    m.signature_refused("c", "other_digest");
    let text = m.render(&Gauges::default());
    for line in [
        "corral_signatures_refused_total{tenant=\"a\\\"b\",reason=\"unsigned\"} 2",
        "corral_signatures_refused_total{tenant=\"c\",reason=\"other_digest\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}
