/** The demo's SVG timeline: one panel per burst, one row per caller, time to the right. */

export interface Row {
  /** When the caller started waiting for the lock (ms); absent: it never waited. */
  waitFrom?: number;
  /** Its critical section (or, unlocked, its whole request), ms. */
  from: number;
  to: number;
  /** held: a lock holder; gave-up: waited past acquireTimeout (409); overlap: an unlocked sale; refused: sold out. */
  kind: 'held' | 'gave-up' | 'overlap' | 'refused';
  label?: string;
}

export interface Burst {
  title: string;
  rows: Row[];
}

const WIDTH = 900;
const LEFT = 20;
const RIGHT = 20;
const ROW = 9;
const GAP = 2;
const COLORS = {
  held: '#2f9e44',
  'gave-up': '#e03131',
  overlap: '#e8590c',
  refused: '#adb5bd',
} as const;

const escape = (text: string): string =>
  text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

export function renderTimeline(bursts: readonly Burst[]): string {
  const parts: string[] = [];
  let y = 10;
  for (const burst of bursts) {
    const start = Math.min(...burst.rows.map((row) => row.waitFrom ?? row.from));
    const end = Math.max(...burst.rows.map((row) => row.to), start + 1);
    const scale = (WIDTH - LEFT - RIGHT) / (end - start);
    const x = (ms: number): number => LEFT + (ms - start) * scale;
    parts.push(
      `<text x="${LEFT}" y="${y + 12}" font-size="13" font-weight="600">${escape(burst.title)}</text>`,
    );
    y += 20;
    for (const row of burst.rows) {
      const mid = y + ROW / 2;
      if (row.waitFrom !== undefined && row.waitFrom < row.from) {
        parts.push(
          `<line x1="${x(row.waitFrom).toFixed(1)}" y1="${mid}" x2="${x(row.from).toFixed(1)}" y2="${mid}" stroke="#868e96" stroke-width="1" stroke-dasharray="3 2"/>`,
        );
      }
      if (row.kind === 'gave-up') {
        const cx = x(row.from);
        parts.push(
          `<path d="M${(cx - 3).toFixed(1)} ${y} l6 ${ROW} m0 -${ROW} l-6 ${ROW}" stroke="${COLORS['gave-up']}" stroke-width="1.5"/>`,
        );
      } else {
        const width = Math.max(1.5, (row.to - row.from) * scale);
        parts.push(
          `<rect x="${x(row.from).toFixed(1)}" y="${y}" width="${width.toFixed(1)}" height="${ROW}" rx="2" fill="${COLORS[row.kind]}" opacity="0.85"><title>${escape(row.label ?? row.kind)}: ${(row.to - row.from).toFixed(1)} ms</title></rect>`,
        );
      }
      y += ROW + GAP;
    }
    parts.push(
      `<text x="${WIDTH - RIGHT}" y="${y + 10}" font-size="10" text-anchor="end" fill="#495057">${(end - start).toFixed(0)} ms</text>`,
    );
    y += 24;
  }
  const legend = [
    ['held', 'critical section (lock held)'],
    ['overlap', 'unlocked sale (overlapping)'],
    ['refused', 'refused: sold out'],
    ['gave-up', 'gave up: 409'],
  ] as const;
  legend.forEach(([kind, text], i) => {
    const lx = LEFT + i * 190;
    parts.push(
      `<rect x="${lx}" y="${y}" width="14" height="${ROW}" rx="2" fill="${COLORS[kind]}"/><text x="${lx + 20}" y="${y + 8}" font-size="11">${text}</text>`,
    );
  });
  parts.push(
    `<line x1="${LEFT + 760}" y1="${y + 4.5}" x2="${LEFT + 784}" y2="${y + 4.5}" stroke="#868e96" stroke-dasharray="3 2"/><text x="${LEFT + 790}" y="${y + 8}" font-size="11">waiting</text>`,
  );
  y += 24;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${y}" viewBox="0 0 ${WIDTH} ${y}" font-family="system-ui, sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
${parts.join('\n')}
</svg>
`;
}
