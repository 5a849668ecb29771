//! Job DAGs: checks a task graph (unique ids, known dependencies, no cycles)
//! and gives the order tasks can run in, their dependents and ancestors.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::Violations;

/// One task as the graph sees it.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// Task id, unique in the job.
    pub id: &'a str,
    /// Ids of the tasks it needs first.
    pub depends_on: &'a [String],
    /// Lower runs first among tasks ready at the same time.
    pub priority: i32,
}

/// A checked graph. Indices are positions in the slice given to [`Dag::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    order: Vec<usize>,
    deps: Vec<Vec<usize>>,
    dependents: Vec<Vec<usize>>,
    ancestors: Vec<Vec<bool>>,
}

impl Dag {
    /// Checks `nodes` and builds the graph; every problem is reported, each
    /// against its field (`tasks[2].depends_on[0]`).
    pub fn build(nodes: &[Node<'_>]) -> Result<Dag, Violations> {
        let mut v = Violations::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            if let Some(first) = index.insert(n.id, i) {
                v.add(
                    format!("tasks[{i}].id"),
                    format!("task id {:?} is already used by tasks[{first}]", n.id),
                );
                index.insert(n.id, first);
            }
        }
        let mut deps = vec![Vec::new(); nodes.len()];
        let mut dependents = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            for (j, d) in n.depends_on.iter().enumerate() {
                let field = format!("tasks[{i}].depends_on[{j}]");
                match index.get(d.as_str()) {
                    None => v.add(field, format!("depends on unknown task {d:?}")),
                    Some(&k) if k == i => v.add(field, "a task cannot depend on itself"),
                    Some(&k) if deps[i].contains(&k) => {
                        v.add(field, format!("{d:?} is listed twice"))
                    }
                    Some(&k) => {
                        deps[i].push(k);
                        dependents[k].push(i);
                    }
                }
            }
        }
        if !v.is_empty() {
            return Err(v);
        }

        // Kahn's algorithm; among ready tasks, lower priority then spec order.
        let mut missing: Vec<usize> = deps.iter().map(Vec::len).collect();
        let mut ready: BinaryHeap<Reverse<(i32, usize)>> = missing
            .iter()
            .enumerate()
            .filter(|(_, m)| **m == 0)
            .map(|(i, _)| Reverse((nodes[i].priority, i)))
            .collect();
        let mut order = Vec::with_capacity(nodes.len());
        while let Some(Reverse((_, i))) = ready.pop() {
            order.push(i);
            for &d in &dependents[i] {
                missing[d] -= 1;
                if missing[d] == 0 {
                    ready.push(Reverse((nodes[d].priority, d)));
                }
            }
        }
        if order.len() < nodes.len() {
            let cycle = find_cycle(&deps, &missing);
            let path: Vec<&str> = cycle.iter().map(|&i| nodes[i].id).collect();
            v.add("tasks", format!("dependency cycle: {}", path.join(" -> ")));
            return Err(v);
        }

        // In order, so every dependency's ancestors are complete before use.
        let mut ancestors = vec![Vec::new(); nodes.len()];
        for &i in &order {
            let mut mine = vec![false; nodes.len()];
            for &d in &deps[i] {
                mine[d] = true;
                for (m, t) in mine.iter_mut().zip(&ancestors[d]) {
                    *m |= *t;
                }
            }
            ancestors[i] = mine;
        }
        Ok(Dag {
            order,
            deps,
            dependents,
            ancestors,
        })
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.deps.len()
    }

    /// True for a graph without tasks.
    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    /// A valid execution order (dependencies first; priority breaks ties).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Direct dependencies of task `i`.
    pub fn deps(&self, i: usize) -> &[usize] {
        &self.deps[i]
    }

    /// Tasks that depend directly on task `i`.
    pub fn dependents(&self, i: usize) -> &[usize] {
        &self.dependents[i]
    }

    /// True when `a` must finish before `b` starts (directly or through others).
    pub fn is_ancestor(&self, a: usize, b: usize) -> bool {
        self.ancestors[b][a]
    }
}

/// A cycle among the tasks Kahn's algorithm could not order (`missing > 0`),
/// closed: the first id is repeated at the end.
fn find_cycle(deps: &[Vec<usize>], missing: &[usize]) -> Vec<usize> {
    let Some(start) = (0..deps.len()).find(|&i| missing[i] > 0) else {
        return Vec::new();
    };
    // Every unordered task has an unordered dependency, so walking them must
    // revisit a task; the walk from its first visit is a cycle.
    let mut seen = vec![usize::MAX; deps.len()];
    let mut path = Vec::new();
    let mut at = start;
    while seen[at] == usize::MAX {
        seen[at] = path.len();
        path.push(at);
        at = deps[at]
            .iter()
            .copied()
            .find(|&d| missing[d] > 0)
            .unwrap_or(at);
    }
    let mut cycle: Vec<usize> = path[seen[at]..].to_vec();
    cycle.reverse();
    cycle.push(cycle[0]);
    cycle
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(spec: &[(&str, &[&str])]) -> Result<Dag, Violations> {
        let owned: Vec<(String, Vec<String>)> = spec
            .iter()
            .map(|(id, d)| (id.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect();
        let nodes: Vec<Node<'_>> = owned
            .iter()
            .map(|(id, d)| Node {
                id,
                depends_on: d,
                priority: 0,
            })
            .collect();
        Dag::build(&nodes)
    }

    #[test]
    fn seed_002_decomposition_orders_and_knows_ancestors() {
        let dag = build(&[
            ("subtask_1", &[]),
            ("subtask_2", &["subtask_1"]),
            ("subtask_3", &["subtask_1", "subtask_2"]),
        ])
        .unwrap();
        assert_eq!(dag.order(), &[0, 1, 2]);
        assert!(dag.is_ancestor(0, 2) && dag.is_ancestor(1, 2) && dag.is_ancestor(0, 1));
        assert!(!dag.is_ancestor(2, 0) && !dag.is_ancestor(1, 0));
        assert_eq!(dag.dependents(0), &[1, 2]);
    }

    #[test]
    fn unknown_self_and_duplicate_references_are_field_violations() {
        let e = build(&[("a", &["zz", "a"]), ("a", &[])])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tasks[1].id: task id \"a\" is already used by tasks[0]"),
            "{e}"
        );
        assert!(
            e.contains("tasks[0].depends_on[0]: depends on unknown task \"zz\""),
            "{e}"
        );
        assert!(
            e.contains("tasks[0].depends_on[1]: a task cannot depend on itself"),
            "{e}"
        );
    }

    #[test]
    fn a_cycle_is_named_task_by_task() {
        let e = build(&[("a", &["c"]), ("b", &["a"]), ("c", &["b"]), ("d", &[])])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("tasks: dependency cycle: "), "{e}");
        for id in ["a", "b", "c"] {
            assert!(e.contains(id), "{e}");
        }
        let path = e.trim_start_matches("tasks: dependency cycle: ");
        assert!(!path.contains('d'), "{e}");
        let ids: Vec<&str> = path.split(" -> ").collect();
        assert_eq!(ids.len(), 4, "closed cycle of three: {e}");
        assert_eq!(ids[0], ids[3]);
    }

    #[test]
    fn priority_breaks_ties_among_ready_tasks() {
        let owned: Vec<(String, Vec<String>, i32)> = vec![
            ("low".into(), vec![], 5),
            ("high".into(), vec![], 1),
            ("after".into(), vec!["low".into()], 0),
        ];
        let nodes: Vec<Node<'_>> = owned
            .iter()
            .map(|(id, d, p)| Node {
                id,
                depends_on: d,
                priority: *p,
            })
            .collect();
        assert_eq!(Dag::build(&nodes).unwrap().order(), &[1, 0, 2]);
    }

    proptest! {
        /// Random graphs: acyclic ones (edges only to lower indices) always
        /// build, in an order that puts every dependency first and with
        /// ancestors equal to reachability; adding a back edge that closes a
        /// path always fails with a cycle.
        #[test]
        fn random_graphs_are_ordered_or_their_cycle_found(
            n in 1usize..24,
            edges in proptest::collection::vec((0usize..24, 0usize..24), 0..60),
            close in any::<bool>(),
        ) {
            let mut deps: Vec<Vec<usize>> = vec![Vec::new(); n];
            for (a, b) in edges {
                let (a, b) = (a % n, b % n);
                if a > b && !deps[a].contains(&b) {
                    deps[a].push(b);
                }
            }
            let ids: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            let mut named: Vec<Vec<String>> =
                deps.iter().map(|d| d.iter().map(|&k| ids[k].clone()).collect()).collect();
            // Reachability by brute force.
            let mut reach = vec![vec![false; n]; n];
            for b in 0..n {
                let mut stack = deps[b].clone();
                while let Some(a) = stack.pop() {
                    if !reach[b][a] {
                        reach[b][a] = true;
                        stack.extend(deps[a].iter().copied());
                    }
                }
            }
            let back = (0..n).flat_map(|b| (0..n).map(move |a| (a, b))).find(|&(a, b)| reach[b][a]);
            let closing = close && back.is_some();
            if let (true, Some((a, b))) = (closing, back) {
                named[a].push(ids[b].clone());
            }
            let nodes: Vec<Node<'_>> = ids
                .iter()
                .zip(&named)
                .map(|(id, d)| Node { id, depends_on: d, priority: 0 })
                .collect();
            match Dag::build(&nodes) {
                Ok(dag) => {
                    prop_assert!(!closing);
                    let mut pos = vec![0; n];
                    for (p, &i) in dag.order().iter().enumerate() {
                        pos[i] = p;
                    }
                    prop_assert_eq!(dag.order().len(), n);
                    for b in 0..n {
                        for a in 0..n {
                            prop_assert_eq!(dag.is_ancestor(a, b), reach[b][a]);
                            if reach[b][a] {
                                prop_assert!(pos[a] < pos[b]);
                            }
                        }
                    }
                }
                Err(e) => {
                    prop_assert!(closing, "unexpected: {}", e);
                    prop_assert!(e.to_string().contains("dependency cycle"));
                }
            }
        }
    }
}
