//! The MESSAGE_ID of each transition the supervisor records, one per
//! reason, so that `journalctl -x` explains it from the shipped catalog
//! and `journalctl MESSAGE_ID=…` finds every transition of one kind. The
//! other reasons are recorded by the helpers (boot, drain, adopted) and
//! the cluster agent's starts and stops (ha-take, fence), which log lines
//! of their own.

use crate::state::records::TransitionReason;

/// None for a reason the supervisor does not record.
pub fn transition_message_id(reason: &TransitionReason) -> Option<&'static str> {
    Some(match reason {
        TransitionReason::StartUser => "f28f5429a4eb47ff894a7bb70e90d38e",
        TransitionReason::StopUser => "0b8a3bc86fe0433ea65ffa2abe5197e6",
        TransitionReason::UnexpectedExit => "9b3474cb1bb844ec83bb712552acdadb",
        TransitionReason::SystemdRestart => "b3db9fafa34b41a79faa1c03f9312d27",
        TransitionReason::Replaced => "f9b45d16a8ac414db4d579cd1d9757e5",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons the supervisor's classifier gives.
    const SUPERVISOR_REASONS: [TransitionReason; 5] = [
        TransitionReason::StartUser,
        TransitionReason::StopUser,
        TransitionReason::UnexpectedExit,
        TransitionReason::SystemdRestart,
        TransitionReason::Replaced,
    ];

    /// The `@FIELD@` names in a catalog entry (`berth@@F@.service` too).
    fn catalog_fields(entry: &str) -> Vec<&str> {
        let mut fields = Vec::new();
        let mut rest = entry;
        while let Some(at) = rest.find('@') {
            rest = &rest[at + 1..];
            let len = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(rest.len());
            if len > 0 && rest[len..].starts_with('@') {
                fields.push(&rest[..len]);
                rest = &rest[len + 1..];
            }
        }
        fields
    }

    #[test]
    fn fields_in_catalog_text() {
        assert_eq!(
            catalog_fields("berth@@BERTH_WORKLOAD@.service, @BERTH_GENERATION@ @ a@b"),
            ["BERTH_WORKLOAD", "BERTH_GENERATION"]
        );
    }

    /// Each reason's own ID, 128 bits in hex as journald wants them, each
    /// with an entry in the catalog that uses only the fields every
    /// transition record carries.
    #[test]
    fn every_transition_has_its_own_catalog_entry() {
        let catalog = include_str!("../../catalog/berth.catalog");
        let mut seen = std::collections::BTreeSet::new();
        for reason in TransitionReason::known() {
            let Some(id) = transition_message_id(&reason) else {
                assert!(
                    !SUPERVISOR_REASONS.contains(&reason),
                    "{reason} has no MESSAGE_ID"
                );
                continue;
            };
            assert!(
                id.len() == 32
                    && id
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                "{reason}: {id}"
            );
            assert!(seen.insert(id), "{reason}: {id} used twice");
            let entry = catalog
                .split("\n-- ")
                .find(|e| e.starts_with(id))
                .unwrap_or_else(|| panic!("{reason}: no catalog entry for {id}"));
            let entry = entry.split("\n\n#").next().unwrap_or(entry);
            for field in catalog_fields(entry) {
                assert!(
                    [
                        "BERTH_WORKLOAD",
                        "BERTH_UNIT",
                        "BERTH_GENERATION",
                        "BERTH_DETECTED_BY"
                    ]
                    .contains(&field),
                    "{reason}: the catalog uses @{field}@, which not every record carries"
                );
            }
        }
        assert_eq!(seen.len(), SUPERVISOR_REASONS.len());
        assert_eq!(
            transition_message_id(&TransitionReason::Other("later".into())),
            None
        );
    }
}
