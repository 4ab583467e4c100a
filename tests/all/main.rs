mod api;
mod binary;
mod config;
mod decorators;
mod embedded_queue;
mod listener;
mod rule_languages;
mod rules;
