// Minimal SVG line charts for the console: no library, no network.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

/**
 * Draws `lines` ([{name, color, values}]) over `times` (unix seconds) into `container`.
 * `format` labels the y axis; `yMax` fixes its top (e.g. 1 for shares), else it fits the data.
 */
function lineChart(container, times, lines, { format = (v) => v.toFixed(1), yMax = null } = {}) {
  const width = container.clientWidth || 400, height = 150;
  const left = 46, right = 8, top = 8, bottom = 20;
  const svg = svgElement("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const all = lines.flatMap((line) => line.values);
  const top_ = yMax ?? Math.max(1e-9, ...all) * 1.15;
  const x = (i) => left + (times.length > 1 ? (i / (times.length - 1)) * (width - left - right) : 0);
  const y = (v) => top + (1 - v / top_) * (height - top - bottom);

  for (const fraction of [0, 0.5, 1]) {
    const value = top_ * fraction;
    svg.append(svgElement("line", { class: "axis", x1: left, x2: width - right, y1: y(value), y2: y(value) }));
    const label = svgElement("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end" });
    label.textContent = format(value);
    svg.append(label);
  }
  if (times.length) {
    for (const [index, anchor] of [[0, "start"], [times.length - 1, "end"]]) {
      const label = svgElement("text", { x: x(index), y: height - 4, "text-anchor": anchor });
      label.textContent = new Date(times[index] * 1000).toLocaleTimeString();
      svg.append(label);
    }
  } else {
    const empty = svgElement("text", { x: width / 2, y: height / 2, "text-anchor": "middle" });
    empty.textContent = "collecting samples…";
    svg.append(empty);
  }
  for (const line of lines) {
    if (!line.values.length) continue;
    const points = line.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(svgElement("polyline", { points, fill: "none", stroke: line.color, "stroke-width": 2, "stroke-linejoin": "round" }));
  }
  const legend = document.createElement("div");
  legend.className = "legend";
  for (const line of lines) {
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${line.color}"></i>`;
    item.append(line.name);
    legend.append(item);
  }
  container.replaceChildren(svg, legend);
}
