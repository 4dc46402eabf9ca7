"""`Inputs`: what the settings name outside this process, each resolved once, on first use, and carried from the
checks (stage 1) through `resolve` (stage 2, as `RunConfig.inputs`) to the run: the Hub snapshots, the scans of
TRAIN_DATA and TRAIN_EVAL_DATA (and, for a method on TRL's trainers, their records), and the data spec the data layer is
given. The settings object is frozen: nothing is kept on it, so a new settings object is a new run and resolves anew.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from trainer.config.online import Rewards, rewards
from trainer.config.resume import hub_pins
from trainer.config.schema import TrainSettings
from trainer.data.cache import default_cache_dir
from trainer.data.chat import TemplateChoice, chosen_template
from trainer.data.discovery import DataSource, scan
from trainer.data.hub_datasets import DATA_FILES
from trainer.data.mix import Mix, combined, eval_set_problems, parse_eval_sets, parse_mix
from trainer.data.preference import PreferenceRecords, read_records
from trainer.data.prompts import PromptRecords, read_prompt_mix, read_prompts
from trainer.data.spec import DataSpec
from trainer.hub.ids import parse_dataset_id
from trainer.hub.sources import KEYS, HubSources, entry_key, resolve_hub, setting_of

# DataSpec field -> the TRAIN_* setting (schema field) it is read from: what shapes the packed data.
DATA_SPEC_SETTINGS = {"seq_len": "seq_len", "text_field": "text_field", "packing": "packing",
                      "long_records": "long_records", "loss_on": "loss_on", "max_bad_lines": "data_max_bad_lines"}


class Inputs:
    """The run's settings with what they name resolved: `hub` (downloads, unless HF_HUB_OFFLINE=1), `data` and
    `eval_data` (scans), each made on first use and kept here."""

    def __init__(self, settings: TrainSettings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"Inputs({self.settings!r})"

    @cached_property
    def hub(self) -> HubSources:
        """The Hub IDs resolved to commits and fetched (pinned to the commits of the checkpoint a resume reads)."""
        return resolve_hub(self.hub_wanted, hub_pins(self.settings), DATA_FILES)

    @cached_property
    def hub_wanted(self) -> dict[str, str]:
        """{key: value} of every setting that may name the Hub; a list (a mix, named eval sets) by its sources,
        each under its own key (trainer.hub.sources.entry_key: `data:chat`), so each is fetched and pinned."""
        lists = {"data": [(e.name, e.source) for e in self.mix.entries],
                 "eval_data": parse_eval_sets(self.settings.eval_data)}  # fmt: skip
        wanted: dict[str, str] = {}
        for key in KEYS:
            sources = lists.get(key)
            wanted.update({entry_key(key, name): source for name, source in sources} if sources
                          else {key: getattr(self.settings, key)})  # fmt: skip
        return wanted

    def hub_problems(self) -> list[str]:
        """What the Hub could not give: a model or tokenizer it did not fetch, a Hub dataset's files once fetched
        (asked by trainer/config/checks.py only when every other check passed)."""
        found = self.hub.problems_of
        problems = [*found.get("model", ()), *found.get("tokenizer", ())]
        if self.on_hub("data"):
            problems += self.data.problems
        if self.on_hub("eval_data"):
            problems += self.eval_data.problems
        return problems

    def on_hub(self, key: str) -> bool:
        """Whether TRAIN_DATA ("data") or TRAIN_EVAL_DATA ("eval_data"), or a source of its list, is a Hub dataset:
        its scan waits for the Hub, which is asked after every other check (hub_problems)."""
        return any(parse_dataset_id(value) for k, value in self.hub_wanted.items() if setting_of(k) == key)

    @cached_property
    def data(self) -> DataSource:
        """The scan of TRAIN_DATA (a mix: one DataSource standing for all its sources, trainer.data.mix.combined)."""
        if self.mix.is_mix:
            return combined(self.settings.data, self.mix, self.mix_sources)
        return self._scan("data")

    @cached_property
    def mix(self) -> Mix:
        """TRAIN_DATA's sources and weights (empty: one plain source)."""
        return parse_mix(self.settings.data)

    @cached_property
    def mix_sources(self) -> list[DataSource]:
        """The scan of each source of the mix, in its order."""
        return [self._scan(entry_key("data", entry.name), entry.source) for entry in self.mix.entries]

    @cached_property
    def eval_data(self) -> DataSource:
        """The scan of TRAIN_EVAL_DATA (a hub-style folder gives its validation split); several eval sets: one
        DataSource standing for them all (their files and problems)."""
        if not self.eval_sets:
            return self._scan("eval_data")
        parts = list(self.eval_sets.values())
        problems = (*eval_set_problems(self.settings.eval_data), *(p for part in parts for p in part.problems))
        files = tuple(dict.fromkeys(f for part in parts for f in part.identity_files()))
        return DataSource(self.settings.eval_data, files=files, problems=problems, variable="TRAIN_EVAL_DATA",
                          reason=f"{len(parts)} eval sets: {', '.join(self.eval_sets)}")  # fmt: skip

    @cached_property
    def eval_sets(self) -> dict[str, DataSource]:
        """TRAIN_EVAL_DATA's named eval sets, each scanned (empty: one plain eval source)."""
        sets = parse_eval_sets(self.settings.eval_data)
        return {name: self._scan(entry_key("eval_data", name), source) for name, source in sets}

    @cached_property
    def pairs(self) -> PreferenceRecords:
        """TRAIN_DATA's preference records, every one read and checked once (trainer.config.method.records_of)."""
        return read_records(self.data, self.settings.data_max_bad_lines)

    @cached_property
    def eval_pairs(self) -> PreferenceRecords:
        """TRAIN_EVAL_DATA's preference records (as `pairs`)."""
        return read_records(self.eval_data, self.settings.data_max_bad_lines)

    @cached_property
    def prompts(self) -> PromptRecords:
        """TRAIN_DATA's prompts (TRAIN_METHOD=grpo/rloo), every record read and checked once; a mix source by
        source."""
        if self.mix.is_mix:
            return read_prompt_mix(self.mix, self.mix_sources, self.settings.data_max_bad_lines)
        return read_prompts(self.data, self.settings.data_max_bad_lines)

    @cached_property
    def eval_prompts(self) -> PromptRecords:
        """TRAIN_EVAL_DATA's prompts (as `prompts`)."""
        return read_prompts(self.eval_data, self.settings.data_max_bad_lines)

    @property
    def rewards(self) -> Rewards:
        """TRAIN_REWARD parsed (once per value: trainer.config.online.rewards), for the run's reward functions."""
        return rewards(self.settings.reward)

    def _scan(self, key: str, value: str | None = None) -> DataSource:
        """The scan of a setting ("data"), or of one source of its list (`entry_key`, with the source as `value`)."""
        value = getattr(self.settings, key) if value is None else value
        hub = self.hub if parse_dataset_id(value) else HubSources()  # local data never asks the Hub
        return scan(key, value, self.data_spec, hub)

    @property
    def data_spec(self) -> DataSpec:
        """What shapes the packed data (and keys its cache)."""
        return DataSpec(**{field: getattr(self.settings, name) for field, name in DATA_SPEC_SETTINGS.items()})

    @property
    def cache_dir(self) -> Path:
        """Where the tokenized data is cached (trainer.data.cache)."""
        return default_cache_dir(self.settings.output_dir)

    @property
    def model_folder(self) -> str:
        """The folder (or preset name) the run loads TRAIN_MODEL from."""
        return self.hub.folder("model", self.settings.model)

    @property
    def tokenizer_folder(self) -> str:
        """The folder TRAIN_TOKENIZER names (its Hub snapshot), else TRAIN_MODEL's: where the tokenizer is read."""
        return self.hub.folder("tokenizer", self.settings.tokenizer) or self.model_folder

    def template(self) -> TemplateChoice:
        """The chat template conversations are rendered with (TRAIN_CHAT_TEMPLATE, else the tokenizer's own);
        ConfigError when TRAIN_CHAT_TEMPLATE names nothing."""
        return chosen_template(self.settings.chat_template, self.tokenizer_folder)
