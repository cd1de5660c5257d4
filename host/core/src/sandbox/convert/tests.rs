use super::*;

#[test]
fn keys_match_in_kebab_snake_and_camel_case() {
    assert!(names_match("first-name", "first-name"));
    assert!(names_match("first-name", "first_name"));
    assert!(names_match("first-name", "firstName"));
    assert!(names_match("max-count", "MaxCount"));
    assert!(names_match("utf8-data", "utf8Data"));
    assert!(!names_match("first-name", "firstname"));
    assert!(!names_match("first-name", "first_name_"));
    assert!(!names_match("first-name", "FIRST_NAME"));
    assert!(!names_match("name", "nam"));
}

#[test]
fn paths_render_fields_and_indices() {
    let mut path = JsonPath::default();
    let err = path.field("items", |p| {
        p.index(3, |p| p.field("price", |p| p.error("bad")))
    });
    assert_eq!(err.to_string(), "$.items[3].price: bad");
    assert_eq!(path.to_string(), "$");
}
