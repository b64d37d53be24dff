"""``glmserve chat``: a terminal chat that streams replies, then renders them as Markdown.

Commands: /help, /reset, /system TEXT, /model [NAME], /save FILE, /load FILE, /exit (or Ctrl-D). Ctrl-C stops
the reply being generated (the generation is aborted) and keeps the program running. Enter
sends; Alt-Enter (Esc then Enter) starts a new line; pasted text keeps its newlines. When
stdin is not a terminal, all of stdin is one message: the reply is printed and the program
exits.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from glmserve.client.backends import ChatError, make_backend
from glmserve.settings.serve import ChatSettings

HELP = """commands:
  /help          this list
  /reset         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt (and start over)
  /model [NAME]  list the server's models, or chat with NAME from now on
  /save FILE     write the conversation as OpenAI-format JSON
  /load FILE     read a conversation saved with /save
  /exit          quit (or Ctrl-D)
Enter sends, Alt-Enter starts a new line, Ctrl-C stops a reply."""


class Conversation:
    """The OpenAI-format message list, with the system prompt kept apart."""

    def __init__(self, system: str | None = None) -> None:
        self.system = system
        self.turns: list[dict[str, str]] = []

    @property
    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def save(self, path: str) -> None:
        Path(path).expanduser().write_text(json.dumps({"messages": self.messages}, indent=2, ensure_ascii=False))

    def load(self, path: str) -> None:
        data = json.loads(Path(path).expanduser().read_text())
        messages = data["messages"] if isinstance(data, dict) else data
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("expected a list of messages with 'role' and 'content'")
        self.system = next((m["content"] for m in messages if m["role"] == "system"), None)
        self.turns = [m for m in messages if m["role"] != "system"]


class ChatApp:
    def __init__(self, settings: ChatSettings, console: Console) -> None:
        self.settings = settings
        self.console = console
        self.backend = make_backend(settings)
        self.conversation = Conversation(settings.system)

    def params(self) -> dict[str, Any]:
        s = self.settings
        return {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p),
                                  ("max_tokens", s.max_tokens)) if v is not None}

    # ---- one reply -----------------------------------------------------------------------

    def reply(self, user_text: str, live: bool = True) -> None:
        """Stream the answer to ``user_text``; on success both turns join the conversation."""
        messages = self.conversation.messages + [{"role": "user", "content": user_text}]
        text = ""
        n_chunks = 0
        usage = None
        start = time.perf_counter()
        first: float | None = None
        interrupted = False
        stream = self.backend.stream(messages, **self.params())
        display = Live(Text(""), console=self.console, refresh_per_second=15, transient=True) if live else None
        try:
            if display:
                display.start()
            for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.delta.content:
                        first = first or time.perf_counter()
                        text += choice.delta.content
                        n_chunks += 1
                        if display:
                            display.update(Text(text))
                        else:
                            sys.stdout.write(choice.delta.content)
                            sys.stdout.flush()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stream.close()  # aborts the generation if it is still going
            if display:
                display.stop()
        if not live:
            sys.stdout.write("\n")
            return
        self.console.print(Markdown(text) if text else Text(""))
        if interrupted:
            self.console.print("[dim]\\[reply stopped][/dim]")
            return
        self.conversation.turns += [{"role": "user", "content": user_text}, {"role": "assistant", "content": text}]
        n = usage.completion_tokens if usage else n_chunks
        elapsed = time.perf_counter() - (first or start)
        rate = f"{(n - 1) / elapsed:.1f} tok/s" if n > 1 and elapsed > 0 else "-"
        self.console.print(f"[dim]{n} tokens, {rate}[/dim]")

    # ---- commands ------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run a /command; False means exit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in {"/exit", "/quit", "/bye"}:
            return False
        if name == "/help":
            self.console.print(HELP, highlight=False)
        elif name == "/reset":
            self.conversation.turns = []
            self.console.print("[dim]conversation cleared[/dim]")
        elif name == "/system":
            self.conversation.system = arg or None
            self.conversation.turns = []
            self.console.print("[dim]system prompt set; conversation cleared[/dim]" if arg
                               else "[dim]system prompt removed; conversation cleared[/dim]")
        elif name == "/model":
            self.pick_model(arg)
        elif name in {"/save", "/load"}:
            if not arg:
                self.console.print(f"[red]usage: {name} FILE[/red]")
            else:
                try:
                    (self.conversation.save if name == "/save" else self.conversation.load)(arg)
                    verb = "saved to" if name == "/save" else "loaded from"
                    self.console.print(f"[dim]{len(self.conversation.messages)} messages {verb} {arg}[/dim]")
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self.console.print(f"[red]{name} failed: {exc}[/red]")
        else:
            self.console.print(f"[red]unknown command {name}; /help lists them[/red]")
        return True

    def pick_model(self, name: str) -> None:
        """``/model``: list the models (the current one marked), or switch to ``name`` (one the
        server lists; the conversation goes on with it)."""
        try:
            models = self.backend.models()
        except ChatError as exc:
            self.console.print(f"[red]error: {exc}[/red]")
            return
        if not name:
            for model, status in models:
                mark = "*" if model == self.backend.model else " "
                self.console.print(f"{mark} {model}  [dim]{status}[/dim]", highlight=False)
        elif name not in {model for model, _ in models}:
            self.console.print(f"[red]no model {name!r}; /model lists them[/red]")
        else:
            self.backend.model = name
            self.console.print(f"[dim]chatting with {name}[/dim]")

    # ---- loops ---------------------------------------------------------------------------

    def interactive(self) -> int:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("escape", "enter")
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        # Ctrl-C stops a reply. A process started in the background by a non-interactive shell
        # inherits SIGINT as ignored, and Python then installs no handler: take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        session = PromptSession(history=InMemoryHistory(), key_bindings=keys)
        self.console.print(f"[dim]glmserve chat with {self.backend.model} ({self.backend.where}); "
                           "/help for commands[/dim]")
        while True:
            try:
                line = session.prompt(">>> ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return 0
                continue
            try:
                self.reply(line)
            except ChatError as exc:
                self.console.print(f"[red]error: {exc}[/red]")

    def piped(self) -> int:
        text = sys.stdin.read().strip()
        if not text:
            return 0
        self.reply(text, live=False)
        return 0


def run_chat(settings: ChatSettings) -> int:
    """Exit status: 0, or 1 with one line on stderr when the chat cannot start or fails."""
    console = Console(highlight=False)
    try:
        app = ChatApp(settings, console)
    except ChatError as exc:
        print(f"glmserve: error: {exc}", file=sys.stderr)
        return 1
    try:
        return app.interactive() if sys.stdin.isatty() else app.piped()
    except ChatError as exc:
        print(f"glmserve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        app.backend.close()
