// The settings dialog's fields <-> the settings object of store.js
// ({system, temperature, top_p, max_tokens, extra}; a blank number is null: the server's default).

const field = (id) => document.getElementById(id);

/** Shows `settings` in the dialog's fields. */
export function fillSettingsForm(settings) {
  field("set-system").value = settings.system;
  field("set-temperature").value = settings.temperature ?? "";
  field("set-top-p").value = settings.top_p ?? "";
  field("set-max-tokens").value = settings.max_tokens ?? "";
  field("set-extra").value = Object.keys(settings.extra).length ? JSON.stringify(settings.extra, null, 2) : "";
}

function number(id, name) {
  const input = field(id);
  if (input.value.trim() === "") return null;
  if (!input.checkValidity() || Number.isNaN(input.valueAsNumber)) {
    throw new Error(`${name}: ${input.validationMessage || "not a number"}`);
  }
  return input.valueAsNumber;
}

/** The settings in the dialog's fields; throws Error naming a field that is out of range or
 * "other request fields" that are not a JSON object. */
export function readSettingsForm() {
  let extra = {};
  const text = field("set-extra").value;
  if (text.trim()) {
    try {
      extra = JSON.parse(text);
    } catch (err) {
      throw new Error(`Other request fields: not JSON (${err.message})`);
    }
    if (!extra || typeof extra !== "object" || Array.isArray(extra)) {
      throw new Error("Other request fields: expected a JSON object");
    }
  }
  return {
    system: field("set-system").value,
    temperature: number("set-temperature", "temperature"),
    top_p: number("set-top-p", "top_p"),
    max_tokens: number("set-max-tokens", "max_tokens"),
    extra,
  };
}
