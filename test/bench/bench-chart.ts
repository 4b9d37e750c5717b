/**
 * The benchmark's chart, as a self-contained SVG: for each contender on the hot key (workload 3b),
 * the handoff gap (p50 and p99, log scale) and the Redis commands each critical section cost.
 */

export interface ChartRow {
  name: string;
  handoffP50: number;
  handoffP99: number;
  commandsPerSection: number;
}

const ROW = 26;
const LABEL = 230;
const PANEL = 300;
const GAP = 60;
const TOP = 58;

export function renderChart(rows: readonly ChartRow[], subtitle: string): string {
  const height = TOP + rows.length * ROW + 46;
  const width = LABEL + PANEL + GAP + PANEL + 20;
  const leftX = LABEL;
  const rightX = LABEL + PANEL + GAP;

  // Handoff: log scale over the decades the values span.
  const values = rows.flatMap((r) => [r.handoffP50, r.handoffP99]).filter((v) => v > 0);
  const lo = Math.pow(10, Math.floor(Math.log10(Math.min(...values))));
  const hi = Math.pow(10, Math.ceil(Math.log10(Math.max(...values))));
  const logX = (v: number): number =>
    (Math.log10(Math.max(v, lo) / lo) / Math.log10(hi / lo)) * PANEL;
  const maxCommands = Math.ceil(Math.max(...rows.map((r) => r.commandsPerSection), 1));
  const linX = (v: number): number => (v / maxCommands) * PANEL;

  const parts: string[] = [];
  const text = (x: number, y: number, body: string, attrs = ''): void =>
    void parts.push(
      `<text x="${x.toFixed(1)}" y="${y.toFixed(1)}" ${attrs}>${escape(body)}</text>`,
    );

  text(10, 20, 'Hot key, 2 processes × 10 workers, 1 ms section, 5 ms think time', 'class="title"');
  text(10, 38, subtitle, 'class="sub"');
  text(leftX, TOP - 6, 'handoff gap, ms (p50 bar, p99 whisker; log scale)', 'class="axis"');
  text(rightX, TOP - 6, 'Redis commands per critical section', 'class="axis"');

  rows.forEach((row, i) => {
    const y = TOP + i * ROW;
    const ours = row.name === 'nestjs-redis-lock';
    text(LABEL - 8, y + 16, row.name, `text-anchor="end" class="${ours ? 'ours' : 'label'}"`);
    const fill = ours ? '#d9480f' : '#5c7cfa';
    const p50 = logX(row.handoffP50);
    const p99 = logX(row.handoffP99);
    parts.push(
      `<rect x="${leftX}" y="${y + 5}" width="${p50.toFixed(1)}" height="14" fill="${fill}"/>`,
      `<line x1="${(leftX + p50).toFixed(1)}" x2="${(leftX + p99).toFixed(1)}" y1="${y + 12}" y2="${y + 12}" stroke="${fill}" stroke-width="2"/>`,
      `<line x1="${(leftX + p99).toFixed(1)}" x2="${(leftX + p99).toFixed(1)}" y1="${y + 6}" y2="${y + 18}" stroke="${fill}" stroke-width="2"/>`,
    );
    text(
      leftX + p99 + 4,
      y + 16,
      `${format(row.handoffP50)} / ${format(row.handoffP99)}`,
      'class="value"',
    );
    const commands = linX(row.commandsPerSection);
    parts.push(
      `<rect x="${rightX}" y="${y + 5}" width="${commands.toFixed(1)}" height="14" fill="${fill}"/>`,
    );
    text(rightX + commands + 4, y + 16, format(row.commandsPerSection), 'class="value"');
  });

  // Axes with ticks.
  const axisY = TOP + rows.length * ROW + 4;
  parts.push(
    `<line x1="${leftX}" x2="${leftX + PANEL}" y1="${axisY}" y2="${axisY}" class="rule"/>`,
    `<line x1="${rightX}" x2="${rightX + PANEL}" y1="${axisY}" y2="${axisY}" class="rule"/>`,
  );
  for (let v = lo; v <= hi * 1.0001; v *= 10) {
    text(leftX + logX(v), axisY + 16, format(v), 'text-anchor="middle" class="tick"');
  }
  for (let v = 0; v <= maxCommands; v += Math.max(1, Math.ceil(maxCommands / 6))) {
    text(rightX + linX(v), axisY + 16, String(v), 'text-anchor="middle" class="tick"');
  }

  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, -apple-system, Segoe UI, sans-serif">
<style>
  .title { font-size: 15px; font-weight: 600; fill: #212529; }
  .sub { font-size: 11px; fill: #495057; }
  .axis { font-size: 12px; fill: #343a40; }
  .label { font-size: 12px; fill: #343a40; }
  .ours { font-size: 12px; font-weight: 700; fill: #d9480f; }
  .value { font-size: 11px; fill: #495057; }
  .tick { font-size: 10px; fill: #868e96; }
  .rule { stroke: #adb5bd; }
</style>
<rect width="100%" height="100%" fill="#ffffff"/>
${parts.join('\n')}
</svg>
`;
}

function format(value: number): string {
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

function escape(value: string): string {
  return value.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}
