// The server's OpenAI API as the page uses it: GET /v1/models, streamed
// POST /v1/chat/completions and, on a server of several models, GET /models/events, with the API key (when there is one) in the Authorization header
// only, never in a URL.

/** An OpenAI error body ({"error": {"message", "type", "param", "code"}}) or a failed call. */
export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.name = "ApiError";
    this.status = status; // HTTP status; 0 when the server could not be reached
    this.code = code;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) ({ message, code } = body.error);
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message, code);
}

/**
 * The data of each server-sent event of `stream` (a ReadableStream of UTF-8 bytes), parsed as
 * JSON, until `data: [DONE]` or the end of the stream. Events are separated by a blank line;
 * `data:` lines of one event are joined with "\n"; comments (`: ping`) and other fields are
 * skipped (HTML's server-sent events format). A `{"error": ...}` event throws ApiError.
 */
export async function* sseData(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        let line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (!data.length) continue;
          const text = data.join("\n");
          data = [];
          if (text === "[DONE]") return;
          const event = JSON.parse(text);
          if (event.error) throw new ApiError(0, event.error.message || "the stream failed", event.error.code);
          yield event;
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

export class Api {
  /** `getKey()`: the API key to send, or "" for none. */
  constructor(getKey) {
    this.getKey = getKey;
  }

  headers(extra = {}) {
    const key = this.getKey();
    return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
  }

  async call(path, init = {}) {
    let response;
    try {
      response = await fetch(path, { ...init, headers: this.headers(init.headers), cache: "no-store" });
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, `cannot reach the server (${err.message})`);
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  /** GET /v1/models: the model cards (id, parent for a LoRA adapter, capabilities). */
  async models() {
    const response = await this.call("/v1/models");
    return (await response.json()).data;
  }

  /**
   * GET /models/events (a server of several models): yields {model, status, error} each time a
   * model starts loading, is loaded or is unloaded; first the status of every model.
   */
  async *modelEvents(signal) {
    const response = await this.call("/models/events", { signal });
    yield* sseData(response.body);
  }

  /** POST /v1/chat/completions with `stream: true`: yields the chunks; `signal` aborts it. */
  async *chat(body, signal) {
    const response = await this.call("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...body, stream: true }),
      signal,
    });
    yield* sseData(response.body);
  }
}
