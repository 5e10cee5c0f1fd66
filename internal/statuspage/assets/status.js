(function () {
  "use strict";
  var main = document.getElementById("status");
  var period = parseInt(main.getAttribute("data-refresh-ms"), 10) || 0;
  var timer = null, busy = false, lastGood = null;

  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined || c === false) continue;
      e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  function known(n) { return typeof n === "number" && n >= 0; }
  function num(n) {
    if (!known(n)) return "?";
    var a = Math.abs(n), units = [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][0]) {
        var v = n / units[i][0];
        return (v >= 100 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, "")) + units[i][1];
      }
    }
    return String(Math.round(n));
  }
  function usd(x) {
    if (typeof x !== "number" || !isFinite(x)) return "?";
    if (x === 0) return "$0";
    if (x < 0.01) return "$" + Number(x.toPrecision(2)).toString();
    if (x < 10000) return "$" + x.toFixed(2);
    return "$" + num(x);
  }
  function ms(v) {
    if (typeof v !== "number" || v <= 0) return "–";
    if (v < 10) return v.toFixed(1) + " ms";
    return v < 1000 ? Math.round(v) + " ms" : (v / 1000).toFixed(v < 10000 ? 2 : 1) + " s";
  }
  function pct(r) { return typeof r === "number" ? Math.round(r * 100) + "%" : "?"; }
  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function clock(t) {
    var d = new Date(t);
    if (isNaN(d)) return "?";
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  // inSeconds says a wait of s seconds: "45 s", "12 min", "5 h", "3 d".
  function inSeconds(s) {
    if (s < 120) return s + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    if (s < 172800) return Math.round(s / 3600) + " h";
    return Math.round(s / 86400) + " d";
  }
  function secondsUntil(t, now) {
    var d = Date.parse(t);
    if (isNaN(d)) return null;
    return Math.max(0, Math.ceil((d - now) / 1000));
  }
  function per(s) {
    if (!known(s)) return "";
    if (s === 60) return "minute";
    if (s === 3600) return "hour";
    if (s === 86400) return "day";
    if (s === 604800) return "week";
    if (s % 86400 === 0) return (s / 86400) + " days";
    if (s % 3600 === 0) return (s / 3600) + " h";
    return s + " s";
  }
  function field(name, value, text, cls) {
    return el("span", { "class": cls, "data-field": name, "data-value": value === undefined || value === null ? null : String(value) }, text);
  }
  function kv(label, node) { return el("div", null, el("dt", null, label), el("dd", null, node)); }
  function bar(value, max, label) {
    var b = el("div", { "class": "bar", role: "meter", "aria-label": label, "aria-valuemin": "0",
      "aria-valuemax": String(max), "aria-valuenow": String(value) }, el("span"));
    var f = max > 0 ? Math.max(0, Math.min(1, value / max)) : 0;
    if (f < 0.1) b.className += " low";
    b.firstChild.style.width = (f * 100).toFixed(1) + "%"; // CSSOM: allowed by the CSP, unlike a style attribute
    return b;
  }

  function circuit(d, now) {
    var state = d.circuit || "closed", text;
    if (state === "open") {
      text = "open: cooling until " + (d.open_until ? clock(d.open_until) : "?");
      var left = d.open_until ? secondsUntil(d.open_until, now) : null;
      if (left !== null) text += " (" + inSeconds(left) + ")";
      if (d.open_reason) text += ", " + d.open_reason.replace(/_/g, " ");
    } else if (state === "half_open") {
      text = "half-open: probing";
    } else {
      text = "closed: serving";
    }
    var cls = state;
    if (d.budget_spent_until && state !== "open") {
      // Its budget is spent: out until it renews, whatever its circuit.
      cls = "open";
      text = "out: budget spent until " + clock(d.budget_spent_until) + " (" + inSeconds(secondsUntil(d.budget_spent_until, now)) + ")";
    }
    if (d.disabled) { cls = "disabled"; text = "drained (disabled), " + text; }
    return el("span", { "class": "circuit " + cls, "data-field": "circuit", "data-state": state }, text);
  }

  function window_(label, kind, d, now) {
    var limit = d["limit_" + kind], remaining = d["remaining_" + kind], reset = d["reset_" + kind];
    var row = [el("span", { "class": "label" }, label)];
    if (!known(limit) && !known(remaining)) {
      row.push(el("span", null, field("remaining_" + kind, -1, "not stated")), el("span"));
      return row;
    }
    row.push(known(limit) && known(remaining) ? bar(remaining, limit, label + " remaining") : el("span"));
    var left = reset ? secondsUntil(reset, now) : null;
    row.push(el("span", null, field("remaining_" + kind, remaining, num(remaining)), " / ",
      field("limit_" + kind, limit, num(limit)), " left",
      left === null ? null : el("span", null, ", reset in ", field("reset_" + kind, left, inSeconds(left)))));
    return row;
  }

  // declaredRow: a limit set in the config (rpm or tpm) and what the
  // router sent of it in the last minute.
  function declaredRow(label, limitField, usedField, d) {
    var limit = d[limitField], used = d[usedField] || 0, left = Math.max(0, limit - used);
    return [el("span", { "class": "label" }, label), bar(left, limit, label + " left"),
      el("span", null, num(left) + " / ", field(limitField, limit, num(limit)), " left (",
        field(usedField, used, num(used)), " sent in the last minute)")];
  }

  function spendRow(label, key, s) {
    s = s || {};
    var p = "usage." + key + ".";
    function c(name, text) { return el("td", null, field(p + name, s[name], text)); }
    return el("tr", null, el("th", { scope: "row" }, label), c("answers", num(s.answers || 0)),
      c("input_tokens", num(s.input_tokens || 0)), c("cached_input_tokens", num(s.cached_input_tokens || 0)),
      c("output_tokens", num(s.output_tokens || 0)), c("reasoning_tokens", num(s.reasoning_tokens || 0)),
      c("cost_usd", usd(s.cost_usd || 0)));
  }

  // budgetText says a budget object (spent_usd, budget_usd, period_seconds,
  // resets_at), when the router reports one.
  function budgetText(b, now) {
    var spent = b.spent_usd, cap = b.budget_usd, parts;
    if (typeof cap === "number" && typeof spent === "number") {
      parts = [usd(Math.max(0, cap - spent)) + " / ", field("budget.budget_usd", cap, usd(cap)), " left",
        known(b.period_seconds) ? " per " + per(b.period_seconds) : null, " (", field("budget.spent_usd", spent, usd(spent)), " spent)"];
    } else {
      parts = [field("budget.spent_usd", spent, usd(spent)), " spent"];
    }
    if (b.resets_at) {
      var left = secondsUntil(b.resets_at, now);
      parts.push(", resets " + clock(b.resets_at) + (left === null ? "" : " (in " + inSeconds(left) + ")"));
    }
    return el.apply(null, ["span", null].concat(parts));
  }
  function budget(b, now) {
    if (!b || typeof b !== "object") return null;
    var spent = b.spent_usd, cap = b.budget_usd;
    return el("div", { "class": "win" }, el("span", { "class": "label" }, "USD"),
      typeof cap === "number" && cap > 0 && typeof spent === "number" ? bar(Math.max(0, cap - spent), cap, "Budget left") : el("span"),
      budgetText(b, now));
  }

  function deployment(d, i, now) {
    var u = d.usage || {}, id = "dep-" + i;
    var a = el("article", { "data-deployment": d.name, "aria-labelledby": id, "class": d.disabled ? "disabled" : (d.circuit || "closed") });
    a.appendChild(el("div", { "class": "head" }, el("h3", { id: id }, d.name), field("type", d.type, d.type || "?", "type")));
    a.appendChild(el("p", { "class": "sub" }, "Model groups: ",
      field("model_groups", (d.model_groups || []).join(" "), (d.model_groups || []).join(", ") || "none"),
      d.base_url ? " · " + d.base_url : null));
    a.appendChild(circuit(d, now));

    a.appendChild(el("h4", null, "Windows the provider stated"));
    var w = el("div", { "class": "win" });
    window_("Requests", "requests", d, now).concat(window_("Tokens", "tokens", d, now)).forEach(function (n) { w.appendChild(n); });
    a.appendChild(w);
    a.appendChild(el("h4", null, "Limits declared in the config"));
    if (d.declared_rpm > 0 || d.declared_tpm > 0) {
      var dw = el("div", { "class": "win" }), rows = [];
      if (d.declared_rpm > 0) rows = rows.concat(declaredRow("rpm", "declared_rpm", "requests_last_minute", d));
      if (d.declared_tpm > 0) rows = rows.concat(declaredRow("tpm", "declared_tpm", "tokens_last_minute", d));
      rows.forEach(function (n) { dw.appendChild(n); });
      a.appendChild(dw);
    } else {
      a.appendChild(el("p", { "class": "empty" }, field("declared_rpm", 0, "none (no rpm or tpm)")));
    }
    var b = budget(d.budget, now);
    if (b) { a.appendChild(el("h4", null, "Budget")); a.appendChild(b); }

    a.appendChild(el("h4", null, "Health"));
    var dl = el("dl", { "class": "kv" });
    dl.appendChild(kv("In flight", field("in_flight", d.in_flight, num(d.in_flight))));
    dl.appendChild(kv("Success rate", field("success_rate", d.success_rate, pct(d.success_rate))));
    dl.appendChild(kv("Latency (EWMA)", field("latency_ewma_ms", d.latency_ewma_ms, ms(d.latency_ewma_ms))));
    dl.appendChild(kv("First token (EWMA)", field("ttft_ewma_ms", d.ttft_ewma_ms, ms(d.ttft_ewma_ms))));
    dl.appendChild(kv("Failures in a row", field("consecutive_failures", d.consecutive_failures, num(d.consecutive_failures || 0))));
    dl.appendChild(kv("Last attempt", d.last_class ? el("span", null, field("last_class", d.last_class, d.last_class.replace(/_/g, " ")),
      d.last_at ? " at " + clock(d.last_at) : null) : field("last_class", "", "none yet")));
    a.appendChild(dl);
    if (d.last_message) a.appendChild(el("p", { "class": "msg" }, "Last failure: ", field("last_message", null, d.last_message)));

    a.appendChild(el("h4", null, "Tokens and cost"));
    a.appendChild(el("table", null,
      el("thead", null, el("tr", null, el("th", { scope: "col" }, el("span", { "class": "sr" }, "Period")), el("th", { scope: "col" }, "Answers"),
        el("th", { scope: "col" }, "Input"), el("th", { scope: "col" }, "Cached"), el("th", { scope: "col" }, "Output"),
        el("th", { scope: "col" }, "Reasoning"), el("th", { scope: "col" }, "Cost"))),
      el("tbody", null, spendRow("Last hour", "last_hour", u.last_hour), spendRow("Total", "total", u.total))));

    a.appendChild(el("h4", null, "Failovers from it, by reason"));
    var fo = u.failovers || {}, keys = Object.keys(fo).sort();
    if (keys.length === 0) a.appendChild(el("p", { "class": "empty" }, field("failovers", 0, "none")));
    else {
      var ul = el("ul", { "class": "fo" });
      keys.forEach(function (k) { ul.appendChild(el("li", null, k.replace(/_/g, " ") + ": ", field("failovers." + k, fo[k], num(fo[k])))); });
      a.appendChild(ul);
    }
    return a;
  }

  function groups(list, now) {
    if (!list.length) return el("p", { "class": "empty" }, "No model group: no llm_router is loaded.");
    var withBudget = list.some(function (g) { return g.budget; });
    var head = el("tr", null, el("th", { scope: "col" }, "Model group"), el("th", { scope: "col" }, "Queued now"),
      el("th", { scope: "col" }, "Waited since load"), el("th", { scope: "col" }, "Mean wait"),
      withBudget ? el("th", { scope: "col" }, "Budget") : null);
    var body = el("tbody");
    list.forEach(function (g) {
      body.appendChild(el("tr", { "data-group": g.name }, el("th", { scope: "row" }, g.name),
        el("td", null, field("queued", g.queued, num(g.queued))),
        el("td", null, field("waited", g.waited, num(g.waited))),
        el("td", null, field("mean_wait_ms", g.mean_wait_ms, g.waited > 0 ? ms(g.mean_wait_ms) : "–")),
        withBudget ? el("td", null, g.budget ? budgetText(g.budget, now) : "–") : null));
    });
    return el("table", null, el("thead", null, head), body);
  }

  // consumers is the table of the consumers that asked of late, on a plan
  // or on none (consumers.go);
  // the section stays hidden while there is none.
  function consumers(list) {
    var head = el("tr", null, el("th", { scope: "col" }, "Consumer"), el("th", { scope: "col" }, "Plan (weight)"),
      el("th", { scope: "col" }, "Requests last minute"), el("th", { scope: "col" }, "Tokens last minute"),
      el("th", { scope: "col" }, "In flight"), el("th", { scope: "col" }, "Spent"));
    var body = el("tbody");
    list.forEach(function (c) {
      var of = function (v, limit) { return num(v) + (limit ? " / " + num(limit) : ""); };
      body.appendChild(el("tr", { "data-consumer": c.consumer }, el("th", { scope: "row" }, c.consumer || "(anonymous)"),
        el("td", null, (c.plan || "no plan") + " (" + c.weight + ")"),
        el("td", null, field("requests_last_minute", c.requests_last_minute, of(c.requests_last_minute, c.rpm))),
        el("td", null, field("tokens_last_minute", c.tokens_last_minute, of(c.tokens_last_minute, c.tpm))),
        el("td", null, field("in_flight", c.in_flight, of(c.in_flight, c.concurrent))),
        el("td", null, c.budget_usd ? field("spent_usd", c.spent_usd, "$" + c.spent_usd.toFixed(4) + " of $" + c.budget_usd + " per " + c.budget_per) : "–")));
    });
    return el("table", null, el("thead", null, head), body);
  }

  function render(data) {
    var now = Date.parse(data.generated_at) || Date.now();
    var deps = data.deployments || [], gs = data.model_groups || [];
    var counts = { closed: 0, half_open: 0, open: 0 };
    deps.forEach(function (d) { counts[d.circuit] = (counts[d.circuit] || 0) + 1; });
    document.getElementById("summary").textContent = deps.length + (deps.length === 1 ? " deployment" : " deployments") +
      ": " + counts.closed + " serving, " + counts.half_open + " half-open, " + counts.open + " cooling.";
    document.getElementById("groups").replaceChildren(groups(gs, now));
    var cs = data.consumers || [];
    document.getElementById("consumers-s").hidden = !cs.length;
    document.getElementById("consumers").replaceChildren(consumers(cs));
    var box = document.getElementById("deployments");
    if (!deps.length) box.replaceChildren(el("p", { "class": "empty" }, "No deployments: no llm_router is loaded in this Caddy."));
    else box.replaceChildren.apply(box, deps.map(function (d, i) { return deployment(d, i, now); }));
  }

  function status(text, stale) {
    var u = document.getElementById("updated");
    u.textContent = text;
    u.className = stale ? "stale" : "";
  }

  function load() {
    if (busy) return;
    busy = true;
    clearTimeout(timer);
    fetch("?format=json", { cache: "no-store", credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (data) {
        render(data);
        lastGood = data.generated_at;
        status("Updated " + clock(data.generated_at) + (period > 0 ? ", every " + period / 1000 + " s." : "; automatic refresh is off."), false);
      })
      .catch(function (e) {
        status("Could not refresh (" + e.message + ")" + (lastGood ? "; showing the state of " + clock(lastGood) + "." : "."), true);
      })
      .then(function () {
        busy = false;
        if (period > 0 && !document.hidden) timer = setTimeout(load, period);
      });
  }

  document.getElementById("refresh").addEventListener("click", load);
  document.addEventListener("visibilitychange", function () { if (!document.hidden && period > 0) load(); });
  load();
})();
