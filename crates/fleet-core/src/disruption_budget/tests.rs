use super::*;
use crate::UnitFile;

fn budget(name: &str, x_fleet: &str) -> Result<Option<DisruptionBudget>, String> {
    let file = UnitFile::parse(&format!("[X-Fleet]\n{x_fleet}")).expect("a unit");
    budget_of(name, file.options())
}

fn member(name: &str, size: MaxUnavailable, by: Option<&str>, value: Option<&str>, down: bool) -> Member {
    Member {
        name: name.to_string(),
        group: "web@.service".to_string(),
        budget: DisruptionBudget { size, by: by.map(str::to_string) },
        value: value.map(str::to_string),
        down,
    }
}

#[test]
fn a_budget_is_a_count_or_a_percentage_grouped_by_a_key_on_a_group_of_units() {
    assert_eq!(budget("web@1.service", ""), Ok(None));
    assert_eq!(
        budget("web@1.service", "DisruptionBudget=2\n"),
        Ok(Some(DisruptionBudget { size: MaxUnavailable::Count(2), by: None }))
    );
    assert_eq!(
        budget("web@.service", "DisruptionBudget=25%\nDisruptionBudgetBy=zone\n"),
        Ok(Some(DisruptionBudget { size: MaxUnavailable::Percent(25), by: Some("zone".into()) }))
    );
    assert!(
        budget("api-1.service", "SpreadBy=zone\nSpreadGroup=api-*\nDisruptionBudget=1\n").is_ok_and(|b| b.is_some())
    );
}

#[test]
fn a_budget_that_cannot_be_kept_or_read_is_refused_naming_the_option() {
    let refused = |name: &str, x_fleet: &str, says: &str| {
        let error = budget(name, x_fleet).expect_err("refused");
        assert!(error.contains(says), "{x_fleet:?} is refused saying {says:?}: {error}");
    };
    refused(
        "web@1.service",
        "DisruptionBudget=0\n",
        "invalid value \"0\" for [X-Fleet] DisruptionBudget: a budget of 0",
    );
    refused("web@1.service", "DisruptionBudget=0%\n", "a budget of 0");
    refused("web@1.service", "DisruptionBudget=two\n", "invalid value \"two\" for [X-Fleet] DisruptionBudget");
    refused("web@1.service", "DisruptionBudget=101%\n", "1% to 100%");
    refused("web@1.service", "DisruptionBudgetBy=zone\n", "DisruptionBudgetBy= needs a DisruptionBudget=");
    refused("web@1.service", "DisruptionBudget=1\nDisruptionBudgetBy=a b\n", "for [X-Fleet] DisruptionBudgetBy");
    refused("db.service", "DisruptionBudget=1\n", "db.service is in none");
}

#[test]
fn a_disruption_goes_through_while_its_group_has_room_and_a_unit_down_already_costs_nothing() {
    let mut budgets = Budgets::new([
        member("web@1.service", MaxUnavailable::Count(1), None, None, false),
        member("web@2.service", MaxUnavailable::Count(1), None, None, false),
        member("web@3.service", MaxUnavailable::Count(1), None, None, true),
    ]);
    let held = budgets.take(["web@1.service"]).expect_err("web@3 is down already");
    assert_eq!(
        held.to_string(),
        "held by the disruption budget of web@.service: 1 down of the 1 it allows (DisruptionBudget=1)"
    );
    assert_eq!(budgets.take(["web@3.service", "other.service"]), Ok(()), "down already, or no budget");
    assert!(!budgets.is_down("web@1.service"), "a refused take takes nothing");
}

#[test]
fn a_budget_by_a_key_holds_per_value_and_a_take_of_several_is_all_or_nothing() {
    let by = Some("zone");
    let mut budgets = Budgets::new([
        member("web@1.service", MaxUnavailable::Count(1), by, Some("a"), false),
        member("web@2.service", MaxUnavailable::Count(1), by, Some("a"), false),
        member("web@3.service", MaxUnavailable::Count(1), by, Some("b"), false),
        member("web@4.service", MaxUnavailable::Count(1), by, Some("b"), false),
    ]);
    let before = budgets.clone();
    assert_eq!(budgets.take(["web@1.service", "web@3.service"]), Ok(()), "one in each zone");
    let held = budgets.take(["web@4.service"]).expect_err("zone b has its one down");
    assert_eq!(held.value.as_deref(), Some("zone=b"));
    assert!(held.to_string().contains("in zone=b: 1 down of the 1 it allows"), "{held}");
    assert_eq!(budgets.taken_since(&before), ["web@1.service", "web@3.service"]);
    assert!(budgets.take(["web@2.service"]).is_err(), "zone a has its one down too");
}

#[test]
fn a_percentage_is_of_the_group_rounded_down_and_at_least_one_and_the_smallest_stated_wins() {
    let members = |size| (1..=10).map(move |n| member(&format!("web@{n}.service"), size, None, None, false));
    let mut budgets = Budgets::new(members(MaxUnavailable::Percent(25)));
    let names: Vec<String> = (1..=10).map(|n| format!("web@{n}.service")).collect();
    assert_eq!(budgets.take(names[..2].iter().map(String::as_str)), Ok(()), "25% of 10 is 2");
    assert!(budgets.take([names[2].as_str()]).is_err());
    let mut tiny = Budgets::new(members(MaxUnavailable::Percent(5)));
    assert_eq!(tiny.take([names[0].as_str()]), Ok(()), "at least one");
    assert!(tiny.take([names[1].as_str()]).is_err());
    let mixed =
        members(MaxUnavailable::Count(3)).chain([member("web@11.service", MaxUnavailable::Count(1), None, None, true)]);
    let mut mixed = Budgets::new(mixed);
    assert!(mixed.take([names[0].as_str()]).is_err(), "the smallest budget stated holds the group");
}
