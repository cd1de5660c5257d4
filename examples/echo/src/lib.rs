//! `demo:echo`: identity functions over every WIT type.

corral_guest::generate!("demo:echo/echo");

use exports::demo::echo::api::{Color, Guest, Order, Permissions, Person, Shape};

struct Echo;

impl Guest for Echo {
    fn echo_bool(v: bool) -> bool {
        v
    }
    fn echo_s8(v: i8) -> i8 {
        v
    }
    fn echo_u8(v: u8) -> u8 {
        v
    }
    fn echo_s16(v: i16) -> i16 {
        v
    }
    fn echo_u16(v: u16) -> u16 {
        v
    }
    fn echo_s32(v: i32) -> i32 {
        v
    }
    fn echo_u32(v: u32) -> u32 {
        v
    }
    fn echo_s64(v: i64) -> i64 {
        v
    }
    fn echo_u64(v: u64) -> u64 {
        v
    }
    fn echo_f32(v: f32) -> f32 {
        v
    }
    fn echo_f64(v: f64) -> f64 {
        v
    }
    fn echo_char(v: char) -> char {
        v
    }
    fn echo_string(v: String) -> String {
        v
    }
    fn echo_bytes(v: Vec<u8>) -> Vec<u8> {
        v
    }
    fn echo_list(v: Vec<Vec<i32>>) -> Vec<Vec<i32>> {
        v
    }
    fn echo_record(v: Person) -> Person {
        v
    }
    fn echo_tuple(v: (u32, String, bool)) -> (u32, String, bool) {
        v
    }
    fn echo_variant(v: Shape) -> Shape {
        v
    }
    fn echo_enum(v: Color) -> Color {
        v
    }
    fn echo_option(v: Option<Option<u32>>) -> Option<Option<u32>> {
        v
    }
    fn echo_results(v: Vec<Result<u32, String>>) -> Vec<Result<u32, String>> {
        v
    }
    fn echo_flags(v: Permissions) -> Permissions {
        v
    }
    fn nothing(_a: u32, _b: String) {}
    fn total(order: Order) -> u64 {
        order
            .items
            .iter()
            .map(|i| u64::from(i.price) * u64::from(i.quantity))
            .sum()
    }
}

export!(Echo);
