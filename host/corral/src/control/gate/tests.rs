//! The gate against real sockets: caps, idle limits, strangers' slots and
//! deadlines.

use super::*;
use tokio::io::AsyncReadExt;

async fn gate(limits: GateLimits) -> (Gate, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gate = Gate::new(listener, limits, "test");
    let address = gate.local_addr().unwrap();
    (gate, address)
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_a_freed_slot_is_reused() {
    let limits = GateLimits {
        connections: 1,
        idle: Duration::from_secs(60),
        strangers: None,
    };
    let (gate, address) = gate(limits).await;
    let _first = TcpStream::connect(address).await.unwrap();
    let held = gate.accept().await;
    let accepting = tokio::spawn(async move { gate.accept().await.stream.peer_addr() });
    // Over the cap: closed as it arrives (its read sees the end).
    let mut second = TcpStream::connect(address).await.unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(second.read(&mut byte).await.unwrap(), 0);
    // A freed slot admits the next one.
    drop(held);
    let third = TcpStream::connect(address).await.unwrap();
    let admitted = accepting.await.unwrap().unwrap();
    assert_eq!(admitted, third.local_addr().unwrap());
}

#[tokio::test]
async fn a_silent_connection_fails_its_read_after_the_idle_limit() {
    let limits = GateLimits {
        connections: 4,
        idle: Duration::from_millis(100),
        strangers: None,
    };
    let (gate, address) = gate(limits).await;
    let _client = TcpStream::connect(address).await.unwrap();
    let mut conn = gate.accept().await;
    let mut buf = [0u8; 8];
    let e = conn.read(&mut buf).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
}

fn strangers(slots: usize, deadline: Duration) -> GateLimits {
    GateLimits {
        connections: 2,
        idle: Duration::from_secs(60),
        strangers: Some(Strangers {
            slots,
            deadline,
            per_tenant: 1,
            operator_reserve: 1,
        }),
    }
}

#[tokio::test]
async fn a_new_stranger_closes_the_oldest_and_an_authenticated_one_stays() {
    let (gate, address) = gate(strangers(2, Duration::from_secs(60))).await;
    let _a = TcpStream::connect(address).await.unwrap();
    let mut first = gate.accept().await;
    let _b = TcpStream::connect(address).await.unwrap();
    let mut second = gate.accept().await;
    // The second authenticates: it leaves the strangers' slots.
    second
        .connect_info()
        .authenticated(Caller::Tenant("a".into()));
    let mut buf = [0u8; 8];
    let pending = tokio::time::timeout(Duration::from_millis(50), second.read(&mut buf)).await;
    assert!(pending.is_err(), "an authenticated connection reads on");
    // Two more strangers: the first is the oldest, and is closed.
    let _c = TcpStream::connect(address).await.unwrap();
    let _third = gate.accept().await;
    let _d = TcpStream::connect(address).await.unwrap();
    let _fourth = gate.accept().await;
    let e = first.read(&mut buf).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
    let still = tokio::time::timeout(Duration::from_millis(50), second.read(&mut buf)).await;
    assert!(
        still.is_err(),
        "the authenticated connection was not evicted"
    );
}

#[tokio::test]
async fn a_stranger_is_closed_at_its_deadline_whatever_it_sends() {
    use tokio::io::AsyncWriteExt;
    let (gate, address) = gate(strangers(4, Duration::from_millis(200))).await;
    let mut client = TcpStream::connect(address).await.unwrap();
    let mut conn = gate.accept().await;
    // It keeps talking (as a client answering pings would)...
    let talk = tokio::spawn(async move {
        for _ in 0..100 {
            if client.write_all(b"ping").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let e = loop {
        match conn.read(&mut buf).await {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    // ...and is closed at its deadline all the same.
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(2));
    talk.abort();
}

#[test]
fn a_tenant_holds_only_its_share_and_the_operator_keeps_a_reserve() {
    let shares = Arc::new(Shares {
        shared: Arc::new(Semaphore::new(3)),
        reserve: Arc::new(Semaphore::new(1)),
        held: Mutex::default(),
        per_tenant: 2,
    });
    let a = Caller::Tenant("a".into());
    let held: Vec<Share> = (0..2).map(|_| shares.take(&a).unwrap()).collect();
    let refused = shares.take(&a).err().unwrap();
    assert!(
        refused.to_string().contains("already holds its 2"),
        "{refused}"
    );
    // Another tenant takes the last shared slot; then none is left for
    // tenants, but the operator still gets in.
    let b = shares.take(&Caller::Tenant("b".into())).unwrap();
    assert!(shares.take(&Caller::Tenant("c".into())).is_err());
    let operator = shares.take(&Caller::Operator).unwrap();
    assert!(shares.take(&Caller::Operator).is_err());
    // A share given back is the tenant's again.
    drop(held);
    assert!(shares.take(&a).is_ok());
    drop((b, operator));
}
