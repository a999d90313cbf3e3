//! Plain text tables for the CLI, laid out by comfy-table: no borders, a
//! header line, columns `gap` spaces apart, each as wide as its widest cell
//! (at least its minimum), text left-aligned and numbers right-aligned, no
//! trailing spaces.

use comfy_table::{presets::NOTHING, CellAlignment, ColumnConstraint, ContentArrangement, Table, Width};

/// A column: its header, whether it is right-aligned, its minimum width
/// (of the cells, without the gap).
pub struct Col<'a> {
    pub name: &'a str,
    pub right: bool,
    pub min: u16,
}

/// The header line and one line per row.
pub fn lines(cols: &[Col<'_>], rows: &[Vec<String>], gap: u16) -> Vec<String> {
    let mut t = Table::new();
    t.load_style(NOTHING).set_content_arrangement(ContentArrangement::Disabled);
    t.set_header(cols.iter().map(|c| c.name).collect::<Vec<_>>());
    for r in rows {
        t.add_row(r.clone());
    }
    for (i, c) in cols.iter().enumerate() {
        let col = t.column_mut(i).expect("a column per header cell");
        let pad = if i == 0 { 0 } else { gap };
        col.set_padding((pad, 0));
        col.set_cell_alignment(if c.right { CellAlignment::Right } else { CellAlignment::Left });
        if c.min > 0 {
            // The bound counts the padding.
            col.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(c.min + pad)));
        }
    }
    t.lines().map(|l| l.trim_end().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let cols = [
            Col { name: "pid", right: true, min: 5 },
            Col { name: "name", right: false, min: 0 },
            Col { name: "count", right: true, min: 0 },
        ];
        let rows =
            vec![vec!["1".into(), "a".into(), "12345678".into()], vec!["22".into(), "long-name".into(), "3".into()]];
        assert_eq!(
            lines(&cols, &rows, 1),
            ["  pid name         count", "    1 a         12345678", "   22 long-name        3"]
        );
    }
}
