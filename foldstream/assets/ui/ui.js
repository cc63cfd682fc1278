// The dashboard (GET /ui/): polls this instance's /cluster, /stores and /metrics every 2 s.
// Every URL is relative to the page, so it works behind a path prefix; nothing is loaded from
// elsewhere. A key lookup goes through api/lookup/, which follows the cluster's redirects on
// the instance (a browser may not read another instance's answer: no CORS).
"use strict";

const PERIOD_MS = 2000;
const state = { previous: null, token: sessionStorage.getItem("foldstream-token") };
const $ = (selector) => document.querySelector(selector);

function text(tag, content, className) {
  const element = document.createElement(tag);
  element.textContent = content;
  if (className) element.className = className;
  return element;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    tr.appendChild(td);
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map(row));
}

async function get(path, asText) {
  const headers = state.token ? { Authorization: "Bearer " + state.token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) {
    $("#token-form").hidden = false;
    throw new Error("this instance wants a bearer token");
  }
  const body = asText ? await response.text() : await response.json();
  return { status: response.status, body };
}

function partitionsOf(byTopic) {
  return Object.entries(byTopic || {})
    .filter(([, partitions]) => partitions.length)
    .map(([topic, partitions]) => `${topic} [${partitions.join(", ")}]`)
    .join("; ");
}

// "0.4 s ago", or a suspect's: its heartbeats are late, no instance sends it requests.
function lastSeen(member) {
  const seen = text("span", `${member.last_seen_s.toFixed(1)} s ago`);
  if (!member.suspect) return seen;
  const cell = document.createElement("span");
  cell.append(seen, " ", text("span", "suspect", "cell suspect"));
  return cell;
}

function showMembers(cluster) {
  const names = {};
  for (const member of cluster.instances) names[member.url] = member.id;
  fill($("#members tbody"), cluster.instances.map((m) => [
    text("span", m.id, m.id === cluster.leader ? "leader" : ""),
    Object.assign(text("a", m.url), { href: m.url + "/ui/" }),
    String(m.generation),
    partitionsOf(m.active),
    partitionsOf(m.standby),
    partitionsOf(m.restoring),
    lastSeen(m),
  ]));
  const settled = cluster.settled ? "settled" : "partitions moving";
  const suspects = cluster.instances.filter((m) => m.suspect).length;
  const said = [`${cluster.instances.length} members`, `generation ${cluster.generation}`, settled];
  if (suspects) said.push(`${suspects} suspect${suspects > 1 ? "s" : ""} (heartbeats late: not sent requests)`);
  if (cluster.view_current === false) said.push("this instance's view is NOT current: it may be cut off from the cluster");
  $("#summary").textContent = said.join(" · ");
  $("#summary").className = suspects || cluster.view_current === false ? "warn" : "";
  return names;
}

function showPartitions(cluster, names) {
  const restoring = {};
  for (const member of cluster.instances) {
    for (const [topic, partitions] of Object.entries(member.restoring || {})) {
      for (const p of partitions) restoring[`${topic}/${p}`] = member.id;
    }
  }
  const tables = Object.entries(cluster.partitions).map(([topic, partitions]) => {
    const table = document.createElement("table");
    table.className = "partition-map";
    table.dataset.topic = topic;
    table.appendChild(row(["partition", "active", "standbys"]));
    for (const [number, owners] of Object.entries(partitions)) {
      const restorer = restoring[`${topic}/${number}`];
      let active;
      if (owners.active) active = text("span", names[owners.active] || owners.active, "cell active");
      else if (owners.suspect) active = text("span", `${names[owners.suspect] || owners.suspect} (suspect)`, "cell suspect");
      else active = text("span", restorer ? `restoring on ${restorer}` : "none", restorer ? "cell restoring" : "cell none");
      const standbys = document.createElement("span");
      for (const copy of owners.standbys) {
        const lag = copy.lag === null ? "?" : copy.lag;
        const name = `${names[copy.url] || copy.url} (${lag})${copy.suspect ? " suspect" : ""}`;
        standbys.appendChild(text("span", name, copy.suspect ? "cell standby suspect" : "cell standby"));
      }
      const tr = row([number, active, standbys]);
      tr.dataset.partition = number;
      table.appendChild(tr);
    }
    return [text("h3", topic), table];
  });
  $("#partitions").replaceChildren(...tables.flat());
}

// The name a store's answering version keeps its state, topics and figures under.
function physical(s) {
  return (s.version || 1) > 1 ? `${s.name}.v${s.version}` : s.name;
}

// "2" or "1 (2 building: 41%)": the answering version and any other not retired.
function versions(s) {
  const others = (s.versions || []).filter((v) => v.version !== s.version && v.state !== "retired");
  const said = others.map((v) => {
    const share = v.total ? ` ${Math.floor((100 * (v.folded || 0)) / v.total)}%` : "";
    return `${v.version} ${v.state}${v.state === "building" ? share : ""}`;
  });
  return said.length ? `${s.version || 1} (${said.join(", ")})` : String(s.version || 1);
}

function showStores(stores, cluster) {
  fill($("#stores tbody"), stores.map((s) => [
    s.name, (cluster.stores[physical(s)] || {}).topic || "", String(s.partitions), s.partitioner,
    versions(s),
  ]));
  const select = $("#lookup-store");
  if (select.options.length !== stores.length) {
    select.replaceChildren(...stores.map((s) => Object.assign(text("option", s.name), { value: s.name })));
  }
}

// Prometheus' text format: {name: [{labels, value}]}.
function parseMetrics(body) {
  const metrics = {};
  for (const line of body.split("\n")) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    (metrics[match[1]] ||= []).push({ labels, value: Number(match[3]) });
  }
  return metrics;
}

function byStore(metrics, name) {
  const values = {};
  for (const sample of metrics[name] || []) values[sample.labels.store] = sample.value;
  return values;
}

function showFigures(metrics, stores) {
  const now = Date.now();
  const records = byStore(metrics, "foldstream_projection_records_total");
  const batches = byStore(metrics, "foldstream_projection_batch_seconds_count");
  const seconds = byStore(metrics, "foldstream_projection_batch_seconds_sum");
  const previous = state.previous;
  fill($("#figures tbody"), stores.map((s) => {
    const store = physical(s);
    const elapsed = previous ? (now - previous.at) / 1000 : 0;
    const rate = previous && elapsed > 0 ? ((records[store] || 0) - (previous.records[store] || 0)) / elapsed : 0;
    const mean = batches[store] ? (1000 * seconds[store]) / batches[store] : 0;
    return [store, String(records[store] || 0), rate.toFixed(1), String(batches[store] || 0), `${mean.toFixed(0)} ms`];
  }));
  state.previous = { at: now, records };
  const transactions = (metrics.foldstream_command_transactions_total || [{ value: 0 }])[0].value;
  const commands = (metrics.foldstream_commands_committed_total || [{ value: 0 }])[0].value;
  $("#commands").textContent = `commands committed: ${commands} in ${transactions} Kafka transactions`;
  fill($("#copies tbody"), (metrics.foldstream_partition_lag || []).map((sample) =>
    [sample.labels.store, sample.labels.partition, String(sample.value)]));
}

async function refresh() {
  try {
    const [cluster, stores, metrics] = await Promise.all([
      get("../cluster"), get("../stores"), get("../metrics", true),
    ]);
    const names = showMembers(cluster.body);
    showPartitions(cluster.body, names);
    showStores(stores.body.stores, cluster.body);
    showFigures(parseMetrics(metrics.body), stores.body.stores);
    document.body.dataset.refreshed = String(Date.now());
  } catch (error) {
    $("#summary").textContent = `cannot read this instance: ${error.message}`;
    $("#summary").className = "down";
  }
}

async function lookup(event) {
  event.preventDefault();
  const store = $("#lookup-store").value;
  const key = $("#lookup-key").value;
  const path = `api/lookup/${encodeURIComponent(store)}/${encodeURIComponent(key)}`;
  const result = $("#lookup-result");
  result.textContent = "…";
  try {
    const answer = await get(path);
    result.textContent = `${answer.status}\n${JSON.stringify(answer.body, null, 2)}`;
  } catch (error) {
    result.textContent = error.message;
  }
  result.dataset.done = String(Date.now());
}

$("#lookup").addEventListener("submit", lookup);
$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("#token").value;
  sessionStorage.setItem("foldstream-token", state.token);
  $("#token-form").hidden = true;
  refresh();
});
refresh();
setInterval(refresh, PERIOD_MS);
