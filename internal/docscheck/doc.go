// Package docscheck holds the checks of the repository's Markdown pages
// (README.md and docs/) that can be written as tests: what a renderer
// would show other than what the page means; and of docker-compose.yml,
// which the README tells to run.
package docscheck
