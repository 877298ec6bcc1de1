// Minimal SVG line charts for the console: no library, no network.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const HEIGHT = 150;
const MARGIN = { left: 46, right: 8, top: 18, bottom: 20 };
// Where the pointer rests on each chart (its x in the chart's units): every refresh redraws the
// chart, and the tooltip is shown again where it was.
const pointers = new WeakMap();

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

function svgText(x, y, content, anchor, className = "") {
  const element = svgElement("text", { x, y, "text-anchor": anchor, class: className });
  element.textContent = content;
  return element;
}

// A line's colour swatch, then `content`: for the legend and the tooltip.
function swatched(line, content) {
  const item = document.createElement("div");
  const swatch = document.createElement("i");
  swatch.className = `series-${line.color}`;
  item.append(swatch, content);
  return item;
}

const clock = (time) => new Date(time * 1000).toLocaleTimeString();

// The y axis's top: a round number at or above `value` whose half, the middle tick, is round too.
function roundCeiling(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 4, 6, 8, 10].map((step) => step * power).find((candidate) => candidate >= value);
}

/**
 * Draws `lines` ([{name, color, values}]) over `times` (unix seconds) into `container`; `color` is
 * one of style.css's series colours (accent, ok, warn, violet). `unit` names the y axis and follows
 * each value in the tooltip, which shows the point nearest the pointer; `format` writes a value in
 * that unit; `yMax` fixes the axis's top (1 for shares), else it fits the data.
 */
function lineChart(container, times, lines, { unit, format = (v) => v.toFixed(1), yMax = null }) {
  const width = container.clientWidth || 400;
  const plot = { left: MARGIN.left, right: width - MARGIN.right, top: MARGIN.top, bottom: HEIGHT - MARGIN.bottom };
  // Without data the axis still needs a top: 2, whose half is whole as well.
  const top = yMax ?? roundCeiling(Math.max(0, ...lines.flatMap((line) => line.values)) * 1.1 || 2);
  const x = (i) => plot.left + (times.length > 1 ? (i / (times.length - 1)) * (plot.right - plot.left) : 0);
  const y = (v) => plot.bottom - (v / top) * (plot.bottom - plot.top);
  const svg = svgElement("svg", { viewBox: `0 0 ${width} ${HEIGHT}`, role: "img" });

  svg.append(svgText(0, plot.top - 8, unit, "start", "unit"));
  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    svg.append(svgElement("line", { class: "axis", x1: plot.left, x2: plot.right, y1: y(value), y2: y(value) }));
    svg.append(svgText(plot.left - 6, y(value) + 4, format(value), "end"));
  }
  if (times.length) {
    svg.append(svgText(x(0), HEIGHT - 4, clock(times[0]), "start"));
    svg.append(svgText(x(times.length - 1), HEIGHT - 4, clock(times.at(-1)), "end"));
  } else {
    svg.append(svgText(width / 2, HEIGHT / 2, "collecting samples…", "middle"));
  }
  for (const line of lines.filter((line) => line.values.length)) {
    const points = line.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(svgElement("polyline", { points, class: `series-${line.color}` }));
  }

  const hover = svgElement("g", {});
  const tooltip = document.createElement("div");
  tooltip.className = "tooltip";
  tooltip.hidden = true;
  const show = (at) => {
    const i = Math.round(Math.min(Math.max((at - plot.left) / (plot.right - plot.left), 0), 1) * (times.length - 1));
    hover.replaceChildren(
      svgElement("line", { class: "guide", x1: x(i), x2: x(i), y1: plot.top, y2: plot.bottom }),
      ...lines.map((line) => svgElement("circle", { class: `series-${line.color}`, cx: x(i), cy: y(line.values[i]), r: 3.5 })),
    );
    const title = document.createElement("div");
    title.textContent = clock(times[i]);
    tooltip.replaceChildren(title, ...lines.map((line) => swatched(line, `${line.name}: ${format(line.values[i])} ${unit}`)));
    tooltip.style.left = `${(x(i) / width) * 100}%`;
    tooltip.classList.toggle("before", x(i) > width / 2);
    tooltip.hidden = false;
  };
  if (times.length) {
    svg.append(hover);
    svg.addEventListener("pointermove", (event) => {
      const box = svg.getBoundingClientRect();
      const at = ((event.clientX - box.left) / box.width) * width;
      pointers.set(container, at);
      show(at);
    });
    svg.addEventListener("pointerleave", () => {
      pointers.delete(container);
      hover.replaceChildren();
      tooltip.hidden = true;
    });
    if (pointers.has(container) && container.matches(":hover")) show(pointers.get(container));
  }

  const legend = document.createElement("div");
  legend.className = "legend";
  legend.append(...lines.map((line) => swatched(line, line.name)));
  container.replaceChildren(svg, tooltip, legend);
}
