/* codeclog report: draws the timelines and waveforms from the page's data, sorts and filters
   the outcome table. Everything it needs is in this page (ECharts is inlined before it). */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var ROW_PX = 24;
  var MAX_ROWS_SHOWN = 30;
  var LABEL_CHARS = 32;  // a request id on the request axis, cut short beyond this
  var TIP_CHARS = 120;  // a request id or an outcome in a tooltip

  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c];
    });
  }

  function shorten(text, chars) {
    text = String(text);
    return text.length <= chars ? text : text.slice(0, chars - 1) + '\u2026';
  }

  function recordText(view, i) {
    var m = view.marks;
    var where = m.topics[m.topic[i]]
      ? 'topic ' + m.topics[m.topic[i]] + ' · partition ' + m.partition[i] + ' · offset ' + m.offset[i]
      : 'scenario event #' + m.offset[i];
    var lines = [
      '<b>record #' + i + '</b> · ' + esc(where),
      'request <b>' + esc(shorten(view.rows[m.row[i]], TIP_CHARS)) + '</b>',
      m.epoch[i] === null ? 'no stream position (' + esc(m.flags[i] || 'not a codec chunk') + ')'
        : 'epoch ' + m.epoch[i] + ' · chunk_seq ' + m.seq[i] + ' · frames ' + m.frames[i],
      'flags: ' + esc(m.flags[i] || '-'),
      'outcome: <b>' + esc(data.kinds[m.kind[i]].name) + '</b>' +
        (m.what[i] ? ' — ' + esc(shorten(m.what[i], 3 * TIP_CHARS)) : '')
    ];
    return lines.join('<br>');
  }

  function countMarks(chart, large) {
    // [records in the chart's data, marks ECharts drew for them (one graphic element each;
    // in large mode one path per kind draws them all); fewer are drawn only when the request
    // axis is zoomed to part of its rows]
    var given = 0;
    var drawn = 0;
    chart.getModel().eachSeries(function (series) {
      if (String(series.id).indexOf('kind:') !== 0) { return; }
      var list = series.getData();
      given += list.count();
      if (large) { drawn += list.count(); return; }
      for (var i = 0; i < list.count(); i++) {
        if (list.getItemGraphicEl(i)) { drawn++; }
      }
    });
    return [given, drawn];
  }

  function timeline(view, element) {
    var m = view.marks;
    var n = m.row.length;
    var rows = view.rows;
    var shown = Math.min(rows.length, MAX_ROWS_SHOWN);
    var labelWidth = Math.min(260, 16 + 7 * rows.reduce(function (w, r) {
      return Math.max(w, Math.min(r.length, LABEL_CHARS));
    }, 4));
    element.style.height = (shown * ROW_PX + 130) + 'px';
    var byKind = data.kinds.map(function () { return []; });
    for (var i = 0; i < n; i++) { byKind[m.kind[i]].push([i, m.row[i]]); }
    var series = data.kinds.map(function (kind, k) {
      var large = view.large && byKind[k].length > 0;  // ECharts' large path fails when empty
      return {
        id: 'kind:' + kind.name, name: kind.name, type: 'scatter', data: byKind[k],
        symbolSize: large ? 6 : 10,
        itemStyle: { color: kind.color, borderColor: '#ffffff', borderWidth: large ? 0 : 0.5 },
        // large: one path per kind, hit-tested for the tooltip (many thousands of marks)
        large: large, largeThreshold: 0, progressive: 0, animation: false, z: 3,
        emphasis: { scale: large ? false : 1.6 }
      };
    });
    var bands = view.epochs.map(function (band) {
      var tint = band[1] % 2 ? 'rgba(30, 136, 229, 0.10)' : 'rgba(67, 160, 71, 0.10)';
      return [
        { name: 'epoch ' + band[1], xAxis: band[2] - 0.45, yAxis: band[0] - 0.42, itemStyle: { color: tint } },
        { xAxis: band[3] + 0.45, yAxis: band[0] + 0.42 }
      ];
    });
    var context = {
      id: 'context', type: 'scatter', data: [], silent: true, animation: false,
      markArea: { silent: true, data: bands, label: { show: true, position: 'insideTopLeft', fontSize: 9, color: '#5f6b7a' } }
    };
    var fatal = data.inputs[view.index].fatal;
    if (fatal) {
      context.markLine = {
        silent: true, symbol: 'none', animation: false,
        lineStyle: { color: '#b71c1c', type: 'dashed', width: 2 },
        label: { formatter: 'strict dies', color: '#b71c1c', position: 'end', fontWeight: 'bold' },
        data: [{ xAxis: fatal.index }]
      };
    }
    series.push(context);
    if (view.divergence_marks.length) {
      series.push({
        id: 'divergences', name: 'first divergence', type: 'scatter', symbol: 'circle', symbolSize: 22,
        itemStyle: { color: 'rgba(0,0,0,0)', borderColor: '#000000', borderWidth: 2 }, z: 4, animation: false,
        data: view.divergence_marks.map(function (d) { return { value: [d.index, d.row], what: d.what }; }),
        tooltip: { formatter: function (p) { return '<b>first divergence</b><br>' + esc(p.data.what); } }
      });
    }
    var zoom = [
      { type: 'inside', xAxisIndex: 0, filterMode: 'none' },
      { type: 'slider', xAxisIndex: 0, filterMode: 'none', height: 18, bottom: 8 }
    ];
    if (rows.length > shown) {
      zoom.push({ type: 'slider', yAxisIndex: 0, filterMode: 'none', width: 14, right: 6,
                  startValue: -1, endValue: shown });
    }
    var chart = echarts.init(element, null, { renderer: 'canvas' });
    chart.setOption({
      animation: false,
      grid: { left: labelWidth, right: rows.length > shown ? 40 : 24, top: 28, bottom: 64 },
      tooltip: {
        trigger: 'item', confine: true, enterable: false,
        formatter: function (p) {
          if (p.seriesId === 'divergences') { return '<b>first divergence</b><br>' + esc(p.data.what); }
          return recordText(view, p.value[0]);
        }
      },
      toolbox: { right: 16, top: 0, feature: { dataZoom: { yAxisIndex: 'none' }, restore: {} } },
      xAxis: { type: 'value', name: 'record # in the input', nameLocation: 'middle', nameGap: 24,
               min: -1, max: Math.max(n, 1), minInterval: 1, splitLine: { show: false },
               axisLine: { onZero: false } },
      yAxis: {
        type: 'value', inverse: true, min: -1, max: rows.length, interval: 1,
        axisLine: { onZero: false },
        axisLabel: { formatter: function (v) {
                       return Number.isInteger(v) && rows[v] !== undefined ? shorten(rows[v], LABEL_CHARS) : '';
                     },
                     fontFamily: 'monospace' },
        splitLine: { show: true, lineStyle: { color: '#eef1f4' } }, axisTick: { show: false }
      },
      dataZoom: zoom,
      series: series
    });
    var counts = countMarks(chart, view.large);
    element.dataset.marks = String(counts[0]);
    element.dataset.drawn = String(counts[1]);
    element.dataset.mode = view.large ? 'large' : 'marks';
    window.addEventListener('resize', function () { chart.resize(); });
    return chart;
  }

  function drawWave(canvas) {
    var peaks = JSON.parse(canvas.dataset.peaks);
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth || 800;
    var height = canvas.clientHeight || 64;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    var ctx = canvas.getContext('2d');
    var audio = canvas.parentNode.querySelector('audio');
    // quiet audio (the tiny test vocoder's) is drawn scaled up to the canvas' height
    var loudest = peaks.reduce(function (m, p) { return Math.max(m, -p[0], p[1]); }, 0);
    var gain = loudest > 0 ? Math.min(0.9 / loudest, 1000) : 1;
    function paint() {
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, width, height);
      var mid = height / 2;
      var step = width / Math.max(peaks.length, 1);
      var played = audio && audio.duration ? audio.currentTime / audio.duration : 0;
      for (var i = 0; i < peaks.length; i++) {
        ctx.fillStyle = (i + 0.5) / peaks.length <= played ? '#1565c0' : '#78909c';
        var top = mid - Math.max(peaks[i][1] * gain, 0.004) * mid;
        var bottom = mid - Math.min(peaks[i][0] * gain, -0.004) * mid;
        ctx.fillRect(i * step, top, Math.max(step - 0.3, 0.6), bottom - top);
      }
      ctx.fillStyle = '#cfd8dc';
      ctx.fillRect(0, mid, width, 0.5);
      if (gain > 1.05) {
        var note = 'peak ' + (20 * Math.log10(loudest)).toFixed(1) + ' dBFS, drawn ×' + gain.toFixed(1);
        ctx.font = '11px sans-serif';
        ctx.fillStyle = 'rgba(255, 255, 255, 0.85)';
        ctx.fillRect(2, 2, ctx.measureText(note).width + 8, 15);
        ctx.fillStyle = '#37474f';
        ctx.fillText(note, 6, 13);
      }
    }
    paint();
    if (audio) {
      audio.addEventListener('timeupdate', paint);
      canvas.addEventListener('click', function (event) {
        if (!audio.duration) { return; }
        var box = canvas.getBoundingClientRect();
        audio.currentTime = audio.duration * (event.clientX - box.left) / box.width;
        paint();
      });
    }
  }

  function compareNumbers(x, y) {
    var a = x === '' ? -Infinity : Number(x);
    var b = y === '' ? -Infinity : Number(y);
    return a < b ? -1 : a > b ? 1 : 0;
  }

  function outcomeTable() {
    var table = document.getElementById('outcome-table');
    if (!table) { return; }
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var filter = document.getElementById('outcome-filter');
    var kind = document.getElementById('outcome-kind');
    var count = document.getElementById('outcome-count');
    function apply() {
      var text = filter.value.toLowerCase();
      var shown = 0;
      rows.forEach(function (row) {
        var visible = (!kind.value || row.dataset.kind === kind.value) &&
          (!text || row.textContent.toLowerCase().indexOf(text) >= 0);
        row.style.display = visible ? '' : 'none';
        if (visible) { shown++; }
      });
      count.textContent = shown + ' of ' + rows.length + ' shown';
    }
    filter.addEventListener('input', apply);
    kind.addEventListener('change', apply);
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, column) {
      th.addEventListener('click', function () {
        var ascending = !th.classList.contains('sorted-asc');
        Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) {
          c.classList.remove('sorted-asc', 'sorted-desc');
        });
        th.classList.add(ascending ? 'sorted-asc' : 'sorted-desc');
        var numeric = th.dataset.type === 'num';
        rows.sort(function (a, b) {
          var x = a.cells[column].textContent.trim();
          var y = b.cells[column].textContent.trim();
          var order = numeric ? compareNumbers(x, y) : x.localeCompare(y);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
    apply();
  }

  window.codeclogCharts = data.inputs.map(function (view, index) {
    view.index = index;
    return timeline(view, document.getElementById('timeline-' + index));
  });
  Array.prototype.forEach.call(document.querySelectorAll('canvas.wave'), drawWave);
  outcomeTable();
  document.body.dataset.ready = '1';
})();
