//! `common::pg_limits::hold_slots` against a real server with a small
//! `max_connections`: a role that is not a superuser is refused with
//! SQLSTATE 53300 once its slots are taken, while the superuser still
//! gets in on the reserved ones; with every slot taken the superuser is
//! refused with 53300 too. Released, the slots are usable again.
mod common;
use common::pg_limits::{Slots, hold_slots, start_with_few_slots};

#[test]
fn held_slots_refuse_new_connections_with_53300() {
    let started = std::time::Instant::now();
    let server = turnsafe_tests::require!(start_with_few_slots(6, 2));
    let db = server.create_db("slots");

    let held = hold_slots(&server, &db, Slots::NonSuperuser).expect("hold the role's slots");
    println!(
        "role held {} connections; refused: SQLSTATE {} {:?}",
        held.held(),
        held.role_refused.code,
        held.role_refused.message
    );
    assert_eq!(held.role_refused.code, "53300");
    assert!(held.held() <= 4, "max_connections 6, 2 reserved: {}", held.held());
    // The superuser still gets in: that is what the reserved slots are for.
    postgres::Client::connect(&server.url(&db), postgres::NoTls).expect("a superuser gets a reserved slot");
    held.release().expect("the slots come back");

    let all = hold_slots(&server, &db, Slots::All).expect("hold every slot");
    let superuser = all.superuser_refused.clone().expect("the superuser was refused");
    println!(
        "every slot held ({} connections); superuser refused: SQLSTATE {} {:?}",
        all.held(),
        superuser.code,
        superuser.message
    );
    assert_eq!(superuser.code, "53300");
    let e = match postgres::Client::connect(&server.url(&db), postgres::NoTls) {
        Ok(_) => panic!("a connection got in with every slot held"),
        Err(e) => e,
    };
    assert_eq!(e.code().map(|c| c.code()), Some("53300"), "{e}");
    all.release().expect("the slots come back");
    println!("{:?}", started.elapsed());
}
