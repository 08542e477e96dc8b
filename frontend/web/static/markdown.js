// A small Markdown renderer for model replies. Safety first: every piece of the model's text is
// HTML-escaped before any tag is added, and the only tags added are the ones below; links keep
// http(s) targets only. Covers what replies use: fenced and inline code, headings, lists, quotes,
// bold, italic, links and paragraphs. An unclosed fence (a reply still streaming) renders as code.
"use strict";

const Markdown = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);

  function inline(escaped) {
    // code spans first, kept out of the other rules
    const spans = [];
    let out = escaped.replace(/`([^`\n]+)`/g, (_, code) => {
      spans.push(`<code>${code}</code>`);
      return `\u0000${spans.length - 1}\u0000`;
    });
    out = out
      .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
      .replace(/__([^_\n]+)__/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*([^*\n]+)\*(?!\w)/g, "$1<em>$2</em>")
      .replace(/(^|[^_\w])_([^_\n]+)_(?!\w)/g, "$1<em>$2</em>")
      .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g,
        '<a href="$2" rel="noopener noreferrer nofollow" target="_blank">$1</a>');
    return out.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
  }

  function blocks(text) {
    const html = [];
    let paragraph = [];
    let list = null;                      // {tag, items}
    const flushParagraph = () => {
      if (paragraph.length) html.push(`<p>${paragraph.map((l) => inline(escape(l))).join("<br>")}</p>`);
      paragraph = [];
    };
    const flushList = () => {
      if (list) html.push(`<${list.tag}>${list.items.map((i) => `<li>${inline(escape(i))}</li>`).join("")}</${list.tag}>`);
      list = null;
    };
    for (const line of text.split("\n")) {
      let m;
      if (!line.trim()) { flushParagraph(); flushList(); continue; }
      if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
        flushParagraph(); flushList();
        const level = m[1].length;
        html.push(`<h${level}>${inline(escape(m[2]))}</h${level}>`);
      } else if ((m = /^\s*[-*+]\s+(.*)$/.exec(line)) || (m = /^\s*\d+[.)]\s+(.*)$/.exec(line))) {
        flushParagraph();
        const tag = /^\s*\d/.test(line) ? "ol" : "ul";
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push(m[1]);
      } else if ((m = /^>\s?(.*)$/.exec(line))) {
        flushParagraph(); flushList();
        html.push(`<blockquote>${inline(escape(m[1]))}</blockquote>`);
      } else {
        flushList();
        paragraph.push(line);
      }
    }
    flushParagraph(); flushList();
    return html.join("");
  }

  function render(text) {
    const out = [];
    const fence = /^```[ \t]*([\w+#.-]*)[^\n]*\n([\s\S]*?)(?:^```[ \t]*$|(?![\s\S]))/gm;
    let last = 0;
    let m;
    while ((m = fence.exec(text)) !== null) {
      out.push(blocks(text.slice(last, m.index)));
      const language = m[1] ? ` class="language-${escape(m[1])}"` : "";
      out.push(`<pre><code${language}>${escape(m[2].replace(/\n$/, ""))}</code></pre>`);
      last = fence.lastIndex;
      if (m[0].length === 0) fence.lastIndex++;
    }
    out.push(blocks(text.slice(last)));
    return out.join("");
  }

  return { render, escape };
})();

if (typeof module !== "undefined") module.exports = Markdown;
