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

  return svgDocument(width, height, parts);
}

function format(value: number): string {
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

function escape(value: string): string {
  return value.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** One contender's figures at each number of processes (workload 7). */
export interface ScaleSeries {
  name: string;
  points: readonly { processes: number; waitP99: number; commandsPerSection: number }[];
}

const COLORS = ['#d9480f', '#5c7cfa', '#37b24d', '#ae3ec9', '#f59f00', '#1098ad'];
const PLOT_W = 300;
const PLOT_H = 170;

/**
 * Workload 7's chart: for each think time (a row), the wait p99 (log scale) and the commands per
 * critical section against the number of processes, a line per contender.
 */
export function renderScaleChart(
  rows: readonly { title: string; series: readonly ScaleSeries[] }[],
  subtitle: string,
): string {
  const names = [...new Set(rows.flatMap((r) => r.series.map((s) => s.name)))];
  const color = (name: string): string =>
    name === 'nestjs-redis-lock' ? COLORS[0] : COLORS[1 + ((names.indexOf(name) + 5) % 5)];
  const left = 70;
  const gap = 90;
  const rowH = PLOT_H + 70;
  const top = 70;
  const width = left + PLOT_W + gap + PLOT_W + 40;
  const height = top + rows.length * rowH + 20 + names.length * 16;
  const parts: string[] = [];
  const text = (x: number, y: number, body: string, attrs = ''): void =>
    void parts.push(
      `<text x="${x.toFixed(1)}" y="${y.toFixed(1)}" ${attrs}>${escape(body)}</text>`,
    );
  text(10, 20, 'Hot key, N processes × 10 workers, 1 ms section', 'class="title"');
  text(10, 38, subtitle, 'class="sub"');

  rows.forEach((row, r) => {
    const y0 = top + r * rowH;
    text(10, y0 - 4, row.title, 'class="axis"');
    const xs = [...new Set(row.series.flatMap((s) => s.points.map((p) => p.processes)))].sort(
      (a, b) => a - b,
    );
    const xOf = (n: number): number =>
      xs.length < 2 ? PLOT_W / 2 : (Math.log2(n / xs[0]) / Math.log2(xs.at(-1)! / xs[0])) * PLOT_W;
    const panel = (
      x0: number,
      label: string,
      value: (p: ScaleSeries['points'][number]) => number,
      log: boolean,
    ): void => {
      const values = row.series.flatMap((s) => s.points.map(value)).filter((v) => v > 0);
      const lo = log ? Math.pow(10, Math.floor(Math.log10(Math.min(...values, 1)))) : 0;
      const hi = log
        ? Math.pow(10, Math.ceil(Math.log10(Math.max(...values, 1))))
        : Math.max(1, Math.ceil(Math.max(...values)));
      const yOf = (v: number): number =>
        y0 +
        16 +
        PLOT_H -
        (log
          ? (Math.log10(Math.max(v, lo) / lo) / Math.log10(hi / lo)) * PLOT_H
          : (v / hi) * PLOT_H);
      text(x0, y0 + 10, label, 'class="axis"');
      parts.push(
        `<line x1="${x0}" x2="${x0 + PLOT_W}" y1="${y0 + 16 + PLOT_H}" y2="${y0 + 16 + PLOT_H}" class="rule"/>`,
        `<line x1="${x0}" x2="${x0}" y1="${y0 + 16}" y2="${y0 + 16 + PLOT_H}" class="rule"/>`,
      );
      for (const n of xs) {
        text(x0 + xOf(n), y0 + PLOT_H + 30, String(n), 'text-anchor="middle" class="tick"');
      }
      const ticks = log
        ? Array.from({ length: Math.round(Math.log10(hi / lo)) + 1 }, (_, i) => lo * 10 ** i)
        : Array.from({ length: 5 }, (_, i) => (hi * i) / 4);
      for (const v of ticks) text(x0 - 4, yOf(v) + 3, format(v), 'text-anchor="end" class="tick"');
      for (const series of row.series) {
        const points = [...series.points].sort((a, b) => a.processes - b.processes);
        const path = points
          .map(
            (p, i) =>
              `${i ? 'L' : 'M'}${(x0 + xOf(p.processes)).toFixed(1)},${yOf(value(p)).toFixed(1)}`,
          )
          .join(' ');
        const stroke = color(series.name);
        parts.push(`<path d="${path}" fill="none" stroke="${stroke}" stroke-width="2"/>`);
        for (const p of points) {
          parts.push(
            `<circle cx="${(x0 + xOf(p.processes)).toFixed(1)}" cy="${yOf(value(p)).toFixed(1)}" r="3" fill="${stroke}"/>`,
          );
        }
      }
    };
    panel(left, 'wait p99, ms (log scale) · processes →', (p) => p.waitP99, true);
    panel(
      left + PLOT_W + gap,
      'Redis commands per section · processes →',
      (p) => p.commandsPerSection,
      false,
    );
  });
  const legendY = top + rows.length * rowH;
  names.forEach((name, i) => {
    const y = legendY + i * 16;
    parts.push(`<rect x="${left}" y="${y - 9}" width="12" height="3" fill="${color(name)}"/>`);
    text(left + 18, y, name, `class="${name === 'nestjs-redis-lock' ? 'ours' : 'label'}"`);
  });
  return svgDocument(width, height, parts);
}

/** A chart's SVG document: its parts on a white page, in the charts' one style. */
function svgDocument(width: number, height: number, parts: readonly string[]): string {
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
